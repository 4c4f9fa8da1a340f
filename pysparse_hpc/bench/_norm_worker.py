"""One peak-memory run of the ``norm`` benchmark, in a process of its own.

``python -m pysparse_hpc.bench._norm_worker GRAPH LIBRARY DATA_DIR EDGES THREADS`` loads the
graph, normalizes a tiny one first (imports, compilation), then resets Linux's high-water mark
of the resident set and normalizes the graph once. It prints one JSON line, ``{"peak_mb":
...}``: the high-water mark above the resident set just before the call, or null where the
mark cannot be reset (not Linux).
"""
import gc
import json
import sys


def _resident_kb(field):
    """``VmRSS`` or ``VmHWM`` of this process (kB), or None."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_high_water_mark():
    """Whether the high-water mark could be reset to the current resident set."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def main(argv):
    graph, library, data_dir, edges, threads = argv
    import torch
    torch.set_num_threads(int(threads))
    from . import norm
    adj, edge_index = norm.load(graph, data_dir or None, int(edges))
    tiny, tiny_index = norm.load("random", None, 100)
    nodes = adj.shape[0]
    # Each library holds its own input only: ours the csr_array, PyG's the edge_index.
    if library == "ours":
        from ..nn import gcn_norm
        source, warm = adj, tiny

        def call(graph, n):
            return gcn_norm(graph)
    else:
        peer = norm._peer()
        source, warm = edge_index, tiny_index

        def call(graph, n):
            return peer(graph, num_nodes=n)
    del adj, edge_index
    call(warm, tiny.shape[0])
    gc.collect()
    before = _resident_kb("VmRSS")
    if before is None or not _reset_high_water_mark():
        call(source, nodes)
        print(json.dumps({"peak_mb": None}))
        return 0
    result = call(source, nodes)
    peak = _resident_kb("VmHWM")
    del result
    print(json.dumps({"peak_mb": (peak - before) / 1024}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
