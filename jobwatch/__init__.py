"""gpu-jobwatch: watches Kubernetes GPU pods and training jobs and says whether their GPUs do useful work."""
