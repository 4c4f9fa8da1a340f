"""The bundled citation graphs."""
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
