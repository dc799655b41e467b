"""Communication transforms: per-worker lifting, worker reductions, sparse averaging."""

from lowbw.transforms._per_worker import per_worker
from lowbw.transforms._reductions import (broadcast_to_workers, group_mean,
                                          num_workers, replace_with_mean,
                                          worker_divergence, worker_mean)
from lowbw.transforms._sparse import (SELECTORS, sparse_average, sparse_count,
                                      sparse_indices, sparse_payload_bytes)

__all__ = [
    "SELECTORS", "broadcast_to_workers", "group_mean", "num_workers",
    "per_worker", "replace_with_mean", "sparse_average", "sparse_count",
    "sparse_indices", "sparse_payload_bytes", "worker_divergence",
    "worker_mean",
]
