"""The bundled citation graphs."""
import os

import numpy as np
import pytest

from pysparse_hpc import csr_array, datasets


@pytest.mark.parametrize("name,nodes,edges,features,classes", [
    ("cora", 2708, 10556, 1433, 7),
    ("citeseer", 3327, 9104, 3703, 6),
])
def test_bundled(name, nodes, edges, features, classes):
    data = datasets.load(name)
    assert isinstance(data.adj, csr_array)
    assert data.adj.shape == (nodes, nodes) and data.num_edges == edges
    assert data.adj.has_canonical_format and data.adj.index_dtype == np.int32
    assert data.x.shape == (nodes, features) and data.x.dtype == np.float32
    assert data.y.shape == (nodes,) and data.num_classes == classes
    assert data.train_mask.dtype == bool
    assert int(data.train_mask.sum()) == 20 * classes
    assert int(data.val_mask.sum()) == 500 and int(data.test_mask.sum()) == 1000
    adj = data.adj.toarray()
    np.testing.assert_array_equal(adj, adj.T)          # symmetric
    assert not np.any(np.diag(adj))                    # no self-loops
    assert name in repr(data)
    # Compared and hashed by identity (field-wise equality would compare the arrays).
    assert data == data and data != datasets.load(name) and len({data, data}) == 1


def test_names_and_errors():
    assert set(datasets.available()) == {"cora", "citeseer"}
    assert datasets.load("CORA").name == "cora"
    with pytest.raises(ValueError, match="unknown dataset 'pubmed'; available: cora, citeseer"):
        datasets.load("pubmed")
    with pytest.raises(TypeError, match="string"):
        datasets.load(3)


def test_random_features_refuse_a_negative_seed():
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        datasets.load("cora", random_features=4, seed=-1)
    # Checked without random features too, as every other argument is: it passed unread
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -5"):
        datasets.load("cora", seed=-5)
    with pytest.raises(TypeError, match="seed must be an integer"):
        datasets.load("cora", seed="abc")


def test_a_corrupt_matrix_names_its_file_and_matrix(tmp_path):
    with np.load(datasets._loader.resources.files(datasets.__name__) / "data" / "cora.npz") \
            as bundled:
        arrays = dict(bundled)
    good_indices = arrays["adj_indices"]
    arrays["adj_indices"] = good_indices.copy()
    arrays["adj_indices"][0] = 5000
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=r"bad.npz' holds an invalid CSR matrix under prefix "
                                         r"'adj_': indices holds column 5000.*\(reading the "
                                         r"adjacency\)$") as raised:
        datasets.load_file(tmp_path / "bad.npz")
    assert str(raised.value).count("bad.npz") == 1
    arrays["adj_indices"] = good_indices
    arrays["feat_indptr"] = arrays["feat_indptr"][:-1]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=r"bad.npz' holds an invalid CSR matrix under prefix "
                                         r"'feat_'.*\(reading the feature matrix\)$") as raised:
        datasets.load_file(tmp_path / "bad.npz")
    assert str(raised.value).count("bad.npz") == 1


def test_a_damaged_label_or_mask_member_names_its_file(tmp_path):
    import zipfile
    with np.load(datasets._loader.resources.files(datasets.__name__) / "data" / "cora.npz") \
            as bundled:
        arrays = dict(bundled)
    np.savez(tmp_path / "objects.npz", **dict(arrays, labels=arrays["labels"].astype(object)),
             allow_pickle=True)
    with pytest.raises(ValueError, match="objects.npz' has a corrupt member 'labels'"):
        datasets.load_file(tmp_path / "objects.npz")
    # A member that is not a .npy array (NumPy hands back its bytes).
    np.savez(tmp_path / "foreign.npz", **{k: v for k, v in arrays.items() if k != "val_mask"})
    with zipfile.ZipFile(tmp_path / "foreign.npz", "a") as archive:
        archive.writestr("val_mask.npy", b"1 0 1")
    with pytest.raises(ValueError, match="foreign.npz' has a member 'val_mask' that is not"):
        datasets.load_file(tmp_path / "foreign.npz")


def test_bundled_split_is_planetoids():
    # Kipf & Welling: the first 20 per class train, the next 500 validate, 1000 test; disjoint.
    for name in datasets.available():
        data = datasets.load(name)
        c = data.num_classes
        np.testing.assert_array_equal(np.flatnonzero(data.train_mask), np.arange(20 * c))
        np.testing.assert_array_equal(np.flatnonzero(data.val_mask), 20 * c + np.arange(500))
        assert not np.any(data.test_mask[:20 * c + 500])
        np.testing.assert_array_equal(np.bincount(data.y[data.train_mask], minlength=c),
                                      np.full(c, 20))
        assert data.y.min() >= -1 and data.y.max() < c


def _small_graph(path, **changes):
    """A 4-node graph file in the bundled layout, with ``changes`` applied to its arrays."""
    arrays = dict(adj_indptr=np.array([0, 1, 2, 3, 4]), adj_indices=np.array([1, 0, 3, 2]),
                  adj_data=np.ones(4, np.float32), adj_shape=np.array([4, 4]),
                  labels=np.array([0, 1, 0, 1]), train_mask=np.array([1, 1, 0, 0], bool),
                  val_mask=np.array([0, 0, 1, 0], bool), test_mask=np.array([0, 0, 0, 1], bool),
                  num_classes=np.array(2))
    arrays.update(changes)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def test_load_file_gives_a_canonical_float32_adjacency(tmp_path):
    # Unsorted rows, a duplicate and float64 weights were kept as stored, against the
    # Dataset's documented float32 canonical adjacency.
    path = _small_graph(tmp_path / "g.npz", adj_indptr=np.array([0, 1, 4, 4, 4]),
                        adj_indices=np.array([1, 2, 0, 2]), adj_data=np.ones(4))
    adj = datasets.load_file(path, random_features=2).adj
    assert adj.dtype == np.float32 and adj.has_canonical_format
    np.testing.assert_array_equal(adj.indptr, [0, 1, 3, 3, 3])
    np.testing.assert_array_equal(adj.indices, [1, 0, 2])
    np.testing.assert_array_equal(adj.data, [1, 1, 2])     # duplicates summed


def test_load_file_keeps_int64_indices_only_where_int32_cannot_hold_them(tmp_path,
                                                                         monkeypatch):
    # int32 was forced: a graph of more than 2**31 - 1 entries failed to load. The limit is
    # lowered to 3 here to stand for that graph.
    from pysparse_hpc import _sputils
    path = _small_graph(tmp_path / "g.npz")
    assert datasets.load_file(path, random_features=2).adj.index_dtype == np.int32
    monkeypatch.setattr(_sputils, "_INT32_MAX", 3)
    adj = datasets.load_file(path, random_features=2).adj
    assert adj.index_dtype == np.int64 and adj.nnz == 4


def test_load_file_refuses_overlapping_masks(tmp_path):
    # A node both trained and validated on gave a silently optimistic validation accuracy.
    path = _small_graph(tmp_path / "g.npz", val_mask=np.array([0, 1, 1, 0], bool))
    with pytest.raises(ValueError, match="g.npz': 1 nodes are in both train_mask and val_mask"):
        datasets.load_file(path, random_features=2)


def test_load_file_checks_every_label(tmp_path):
    # Outside the masks a label of num_classes (or a uint64 wrapped to -1 by the cast) passed,
    # though Dataset promises 0..num_classes - 1 or -1.
    path = tmp_path / "g.npz"
    for labels in (np.array([0, 1, 0, 2]), np.array([0, 1, 0, 2**64 - 1], np.uint64)):
        _small_graph(path, labels=labels, test_mask=np.zeros(4, bool))
        with pytest.raises(ValueError, match=r"g.npz': labels range over 0..\d+; expected 0..1, "
                                             r"or -1 for a node without a label"):
            datasets.load_file(path, random_features=2)
    _small_graph(path, labels=np.array([0, 1, 0, -1]), test_mask=np.zeros(4, bool))
    assert datasets.load_file(path, random_features=2).y[3] == -1


def test_load_file_refuses_more_classes_than_nodes(tmp_path):
    """3e8 classes on a 4-node graph asked torch for 19 GB of output weights in training."""
    path = _small_graph(tmp_path / "g.npz", num_classes=np.array(300_000_000))
    with pytest.raises(ValueError, match="num_classes is 300000000, more than its 4 nodes"):
        datasets.load_file(path, random_features=2)


def test_an_encrypted_member_is_a_named_error(tmp_path):
    """A member flagged encrypted (or of a compression zipfile lacks) raised zipfile's bare
    RuntimeError (NotImplementedError)."""
    path = _small_graph(tmp_path / "g.npz")
    data = bytearray(path.read_bytes())
    for signature, flag_offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = data.find(signature)
        while start >= 0:
            data[start + flag_offset] |= 1           # the encryption bit
            start = data.find(signature, start + 4)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="g.npz' has a corrupt member .*encrypted"):
        datasets.load_file(path, random_features=2)


def test_load_file_names_what_a_wrong_file_lacks(tmp_path):
    import scipy.sparse
    # Features stored without feat_indptr were reported as "no features" at all.
    path = _small_graph(tmp_path / "g.npz", feat_indices=np.array([0], np.int32),
                        feat_data=np.ones(1, np.float32), feat_shape=np.array([4, 3]))
    with pytest.raises(ValueError, match=r"missing keys \['feat_indptr'\]"):
        datasets.load_file(path)
    # One bare matrix (scipy's layout, the SuiteSparse files') is told as such.
    scipy.sparse.save_npz(tmp_path / "m.npz", scipy.sparse.eye(4, format="csr"))
    with pytest.raises(ValueError, match="m.npz' holds one sparse matrix .* not a graph"):
        datasets.load_file(tmp_path / "m.npz")
    # Every missing key at once, not the adjacency's first and the labels' on the next try.
    _small_graph(path, adj_indptr=None, labels=None)
    with pytest.raises(ValueError, match="g.npz' lacks adj_indptr, labels "):
        datasets.load_file(path, random_features=2)


def test_load_file_checks_its_arguments(tmp_path):
    path = _small_graph(tmp_path / "g.npz")
    # A bytes path named the dataset b'g'.
    assert datasets.load_file(os.fsencode(path), random_features=2).name == "g"
    with pytest.raises(TypeError, match="name must be a string, got int"):
        datasets.load_file(path, random_features=2, name=3)
    # A bad width is the caller's fault, said before (not instead of after) reading the file.
    with pytest.raises(ValueError, match="random_features must be a positive width"):
        datasets.load_file(tmp_path / "missing.npz", random_features=0)
