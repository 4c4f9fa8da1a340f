# Fused types shared by every typed module (included, not cimported, so no runtime module is needed).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t

# Index arrays: scipy's rule picks int32 unless a dimension or nnz needs int64.
ctypedef fused index_t:
    int32_t
    int64_t

# Values that are summed: float16 input is summed in float32 by the Python layer, then rounded once.
ctypedef fused real_t:
    float
    double

# Values that are only moved: float16 travels as its raw 16-bit pattern, so copies are exact.
ctypedef fused moved_t:
    uint16_t
    float
    double
