"""Which variables send sparse gradients (pure policy)."""
from hvdtrain.training.steps import sparse_choice


def test_large_tables_go_sparse_small_ones_and_non_tables_dense() -> None:
    shapes = [(1_000_000, 16), (50, 8), (64, 3), (3,), (100_000, 4)]
    assert sparse_choice(shapes, 100_000) == (True, False, False, False, True)
    assert sparse_choice(shapes, 0) == (False,) * 5  # 0: always dense
