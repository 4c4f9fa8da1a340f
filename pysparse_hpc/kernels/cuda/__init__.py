"""Numba CUDA kernels: tensor-core (mma) SpMM on ME-BCRS and CUDA-core CSR kernels.

Every kernel has one source. On a real GPU the mma instructions are inline PTX; under the CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported) an exact emulation of the
same fragment layouts runs instead, chosen at import time in `_mma`.
"""
