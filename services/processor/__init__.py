"""The processor: claims jobs, runs their frames through the models and the workflow
graph, and publishes what reaches an output (worker.py composes leases.py, pipeline.py
and publishing.py; docs/architecture.md#the-processors-pipeline)."""
