"""Communication transforms: codecs, error feedback, per-worker lifting,
worker reductions, sparse averaging."""

from lowbw.transforms._boundary import (boundary, boundary_bytes,
                                        parse_boundary_codec,
                                        parse_pipeline_workers,
                                        pipeline_worker, stage_boundary,
                                        subspace)
from lowbw.transforms._cast import cast
from lowbw.transforms._codec import (Codec, Payload, chain, collective,
                                     compress, decode_tree, encode_tree,
                                     make_codec, payload_nbytes, roundtrip)
from lowbw.transforms._codec_spec import forms as codec_forms
from lowbw.transforms._codec_spec import register_codec
from lowbw.transforms._codec_spec import UNCOMPRESSED, as_codec, parse_codec
from lowbw.transforms._compression import (Compression, comm_channel,
                                           compression, roundtrip_workers,
                                           transmit)
from lowbw.transforms._dct import dct_top_k
from lowbw.transforms._error_feedback import (ErrorFeedbackState,
                                              error_feedback, feedback_step)
from lowbw.transforms._lowrank import low_rank
from lowbw.transforms._per_worker import per_worker
from lowbw.transforms._robust import adversaries, corrupt, robust_mean
from lowbw.transforms._quantize import e3m0, int8, quantize, sign
from lowbw.transforms._reductions import (all_workers, broadcast_to_workers,
                                          call_participating, group_mean,
                                          local_workers, num_workers,
                                          participants, participating,
                                          replace_with_mean, sharded_workers,
                                          worker_correlation,
                                          worker_divergence, where_workers,
                                          worker_ids, worker_mean, worker_sum)
from lowbw.transforms._sparse import (sparse_average, sparse_count,
                                      sparse_indices)
from lowbw.transforms._chunk import Chunker, index_dtype
from lowbw.transforms._topk import random_k, top_k

__all__ = [
    "UNCOMPRESSED", "codec_forms", "register_codec", "Codec", "Compression",
    "ErrorFeedbackState", "Payload", "broadcast_to_workers", "cast", "chain",
    "collective", "comm_channel", "compress", "compression", "dct_top_k",
    "decode_tree", "encode_tree", "error_feedback", "feedback_step",
    "group_mean", "Chunker", "index_dtype", "make_codec", "num_workers",
    "as_codec", "e3m0", "int8", "low_rank", "parse_codec", "payload_nbytes",
    "per_worker", "quantize", "random_k", "replace_with_mean", "roundtrip",
    "roundtrip_workers", "sign", "sparse_average", "sparse_count",
    "sparse_indices", "top_k", "transmit",
    "adversaries", "corrupt", "robust_mean",
    "worker_correlation", "worker_divergence", "worker_mean", "all_workers",
    "local_workers", "call_participating", "participants",
    "participating", "sharded_workers", "worker_ids", "where_workers",
    "worker_sum",
    "boundary", "boundary_bytes", "parse_boundary_codec", "stage_boundary",
    "subspace", "parse_pipeline_workers", "pipeline_worker",
]
