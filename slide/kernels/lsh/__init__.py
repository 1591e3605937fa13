"""LSH subsystem: hash families (``hashes``), CSR hash tables (``index``), active-set samplers
(``samplers``). See ARCHITECTURE.md for the kernel contracts."""
from slide.kernels.lsh.hashes import (FAMILIES, HashFunctions, bits_per_hash, check_hash_config,
                                      draw_hash_functions, hash_dense_batch, hash_dense_into,
                                      hash_sparse_batch, hash_sparse_into)
from slide.kernels.lsh.index import POLICIES, LSHIndex, build_tables_into, insertion_order
from slide.kernels.lsh.samplers import (SAMPLERS, active_capacity, make_scratch, sample_batch,
                                        sample_into, scratch_sizes)


__all__ = ["FAMILIES", "HashFunctions", "bits_per_hash", "check_hash_config", "draw_hash_functions",
           "hash_dense_batch", "hash_dense_into", "hash_sparse_batch", "hash_sparse_into",
           "POLICIES", "LSHIndex", "build_tables_into", "insertion_order", "SAMPLERS",
           "active_capacity", "make_scratch", "sample_batch", "sample_into", "scratch_sizes"]
