"""A stand-in communicator for timing one rank's share of a compressed Lion step in one
process (the asv benchmarks) and for testing the vote formats' whole path without MPI."""

__all__ = ["AgreeingPartner"]


class AgreeingPartner:
    """Rank 0 of two whose partner sends what this rank sends: the collectives
    `pysparse_hpc.optim.DistributedLion` calls (``Allreduce``, ``Allgatherv``, ``Sendrecv``)
    do their arithmetic and copies as on two ranks, with no MPI. A real one-rank job takes
    Lion's own step instead, having nothing to compress."""

    rank, size = 0, 2

    def Allreduce(self, buffer, op="sum", kind=None):
        if op == "sum":
            buffer *= 2
        return buffer

    def Allgatherv(self, sendbuf, recvbuf, counts, kind=None):
        recvbuf.reshape(2, -1)[:] = sendbuf
        return recvbuf

    def Sendrecv(self, sendbuf, dest, recvbuf, source, tag=0, kind=None):
        recvbuf[:] = sendbuf
        return recvbuf
