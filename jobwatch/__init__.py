"""gpu-jobwatch: watches Kubernetes GPU pods and training jobs and says whether their GPUs do useful work."""

__version__ = "0.1.0"
