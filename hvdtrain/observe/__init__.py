"""What users watch: the loop's events and the hook protocol observers implement, the console and progress
bars, MLflow tracking, Prometheus metrics, TensorBoard, Horovod timelines, step-time breakdowns and plots."""
