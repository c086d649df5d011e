"""The model layer: model builders, task heads, metrics and exact distributed evaluation, learning-rate
schedules, early stopping, and the Keras 3 checks."""
