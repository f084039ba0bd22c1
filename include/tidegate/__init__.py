"""tidegate: change data capture as bounded micro-batches. This package never imports Airflow."""

__version__ = "0.1.0"
