"""The component image's dependency layer is the same bytes from any environment holding the same versions.

The real node caches the unpacked layer by digest (6 GB): a layer that named the environment it was
linked from (the venv's console-script shebangs, hashed in each RECORD) or its install time (bytecode
checked by mtime) made CI's fresh clone re-unpack it on every run.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil

from localcluster import images, trainimage


def _layer_digest(tree) -> str:
    """The layer's digest as the image build computes it (a one-layer OciImage of the tree)."""
    (layer,) = images.OciImage("localhost/layer-digest:1", [tree], {}).layers
    return layer["digest"]


def test_the_dependency_layer_holds_no_bytecode_and_no_record_of_what_it_left_out(tmp_path):
    kfp = md.distribution("kfp")  # it has console scripts (../../../bin/kfp) and bytecode in its RECORD
    assert any(str(f).startswith("../") for f in kfp.files) and any(
        "__pycache__" in f.parts for f in kfp.files
    )
    trainimage._link_tree([kfp], tmp_path)
    site = tmp_path / trainimage.SITE
    assert not list(site.rglob("__pycache__"))
    record = (site / f"kfp-{kfp.version}.dist-info" / "RECORD").read_text().splitlines()
    assert record and not [line for line in record if line.startswith("../")]
    assert (site / "kfp" / "__init__.py").stat().st_ino == kfp.locate_file("kfp/__init__.py").stat().st_ino


def test_two_installs_of_the_same_versions_give_the_same_layer(tmp_path):
    """A second install of the same wheel, in another place: other shebangs, other mtimes."""
    kfp = md.distribution("kfp")
    other = tmp_path / "other-env" / "lib" / "python3.11" / "site-packages"
    for rel in kfp.files:
        src = kfp.locate_file(rel)
        if src.is_file():
            dst = (other / rel).resolve()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)  # new mtimes
    script = tmp_path / "other-env" / "bin" / "kfp"
    script.write_text(f"#!{script.parent}/python\n" + script.read_text().split("\n", 1)[1])
    (other / "kfp" / "__pycache__").mkdir(exist_ok=True)
    (other / "kfp" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"compiled elsewhere")
    record = other / f"kfp-{kfp.version}.dist-info" / "RECORD"
    record.write_text(record.read_text().replace("../../../bin/kfp,sha256=", "../../../bin/kfp,sha256=X"))
    (copy,) = md.distributions(path=[str(other)])
    trainimage._link_tree([kfp], tmp_path / "here")
    trainimage._link_tree([copy], tmp_path / "there")
    assert _layer_digest(tmp_path / "here") == _layer_digest(tmp_path / "there")
