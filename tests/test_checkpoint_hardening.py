"""Checkpoints as untrusted input: bombs, device files, reused arrays, duplicate members, any
depth, temporary files, and no code or import before the file matched ``like``.

The cases that could exhaust memory or hang run ``load`` in a child process with a time
limit, and read the child's peak memory from ``os.wait4``.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from optimisers import (
    Adam,
    Descent,
    Leaf,
    MixedPrecision,
    Rule,
    load,
    save,
    setup,
    update_,
)

PEAK_MB = 600  # the most memory a refused bomb may cost the process that loads it
CHUNK = b" " * (1 << 20)


# ----------------------------------------------------------------------------- helpers


def model() -> dict:
    return {"enc": {"w": np.arange(6, dtype=np.float32).reshape(3, 2),
                    "b": np.arange(2, dtype=np.float64)}}


def trained(path: Any) -> Any:
    """An Adam tree after one step, saved at ``path``."""
    m = model()
    tree, _ = update_(setup(Adam(0.1), m), m, {"enc": {"w": np.ones((3, 2), np.float32),
                                                     "b": np.ones(2)}})
    save(path, tree)
    return tree


def members(path: Any) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def document(path: Any) -> dict:
    return json.loads(members(path)["checkpoint.json"])


def rewrite(path: Any, replace: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> None:
    """Rewrite a checkpoint with some members replaced, all written with ``method``."""
    found = members(path)
    found.update(replace)
    with zipfile.ZipFile(path, "w", method, compresslevel=1) as zf:
        for n, data in found.items():
            zf.writestr(n, data)


def edit_json(path: Any, change: Any) -> None:
    doc = document(path)
    change(doc)
    rewrite(path, {"checkpoint.json": json.dumps(doc).encode()})


PEAK_REPORT = """
import atexit, resource

def _report_peak():  # this process's own high-water mark: VmHWM is per address space, while
    try:            # ru_maxrss keeps the parent's from before exec
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except OSError:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("PEAK_KB", kb, flush=True)

atexit.register(_report_peak)
"""


def run_child(code: str, timeout: float = 60.0) -> tuple[int, str, float]:
    """Run ``code`` in a fresh Python; ``(exit code, output, peak resident MB)``. Fails the
    test when the child outlives ``timeout`` seconds (it is killed)."""
    try:
        done = subprocess.run([sys.executable, "-c", PEAK_REPORT + textwrap.dedent(code)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child ran longer than {timeout} s (killed)")
    lines = (done.stdout + done.stderr).splitlines()
    peaks = [int(line.split()[1]) for line in lines if line.startswith("PEAK_KB")]
    text = "\n".join(line for line in lines if not line.startswith("PEAK_KB"))
    return done.returncode, text, peaks[-1] / 1024 if peaks else float("inf")


LOAD_IN_CHILD = """
    import numpy as np
    from optimisers import Adam, load, setup
    like = setup(Adam(), {{"enc": {{"w": np.ones((3, 2), np.float32), "b": np.ones(2)}}}})
    try:
        load({path!r}, like=like)
        print("LOADED")
    except ValueError as e:
        print("REFUSED", e)
"""


def load_in_child(path: Any, timeout: float = 60.0) -> tuple[str, float]:
    """``load`` of ``path`` in a child: its output and peak memory in MB."""
    rc, text, peak = run_child(LOAD_IN_CHILD.format(path=str(path)), timeout)
    assert rc == 0, text
    return text, peak


def lie_about_size(path: Any, name: str, size: int) -> None:
    """Set the uncompressed size that the ZIP's central directory declares for ``name``."""
    data = bytearray(path.read_bytes())
    at = data.rindex(b"PK\x01\x02\x14")  # central directory entries follow the data
    while True:
        at = data.index(b"PK\x01\x02", at)
        length = struct.unpack_from("<H", data, at + 28)[0]
        if bytes(data[at + 46:at + 46 + length]) == name.encode():
            struct.pack_into("<I", data, at + 24, size)
            path.write_bytes(bytes(data))
            return
        at += 46


@dataclass(frozen=True)
class Nested(Rule):
    """A rule with a free-form hyper-parameter, to nest values."""

    extra: Any = None

    def init(self, x: Any) -> None:
        return None

    def apply(self, state: Any, x: Any, dx: Any) -> tuple:
        return state, dx


@pytest.fixture
def ckpt(tmp_path: Any) -> Any:
    return tmp_path / "opt.ckpt"


# ----------------------------------------------------------------------------- bombs


def test_json_bomb_is_refused_within_memory(ckpt: Any) -> None:
    """A 2 MB file whose checkpoint.json inflates to 512 MiB of whitespace (valid JSON
    after the document): refused unread, far under the memory limit."""
    trained(ckpt)
    doc = members(ckpt)["checkpoint.json"]
    arrays = {n: d for n, d in members(ckpt).items() if n != "checkpoint.json"}
    with zipfile.ZipFile(ckpt, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("checkpoint.json", "w", force_zip64=True) as f:
            f.write(doc)
            for _ in range(512):
                f.write(CHUNK)
        for n, d in arrays.items():
            zf.writestr(n, d)
    assert ckpt.stat().st_size < 4_000_000
    text, peak = load_in_child(ckpt)
    assert peak < PEAK_MB, f"{peak:.0f} MB: {text}"
    assert text.startswith("REFUSED") and "'checkpoint.json' is compressed" in text, text


def test_member_bomb_declaring_a_small_size_is_refused_within_memory(ckpt: Any) -> None:
    """An array member that declares its record's 64 bytes but inflates to 512 MiB."""
    trained(ckpt)
    with zipfile.ZipFile(ckpt) as zf:
        size = zf.getinfo("arrays/3.npy").file_size
    found = members(ckpt)
    with zipfile.ZipFile(ckpt, "w", zipfile.ZIP_STORED) as zf:
        for n, d in found.items():
            if n == "arrays/3.npy":
                info = zipfile.ZipInfo(n)
                info.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(info, "w", force_zip64=True) as f:
                    f.write(d)
                    for _ in range(512):
                        f.write(CHUNK)
            else:
                zf.writestr(n, d)
    lie_about_size(ckpt, "arrays/3.npy", size)
    text, peak = load_in_child(ckpt)
    assert peak < PEAK_MB, f"{peak:.0f} MB: {text}"
    assert text.startswith("REFUSED") and "'arrays/3.npy' is compressed" in text, text


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_every_compression_method_is_refused(ckpt: Any, method: int) -> None:
    tree = trained(ckpt)
    rewrite(ckpt, {}, method)
    with pytest.raises(ValueError, match=rf"is compressed or encrypted \(method {method}\); "
                                         r"save stores every member as is"):
        load(ckpt, like=tree)


def test_stored_member_larger_than_its_record_is_refused(ckpt: Any) -> None:
    tree = trained(ckpt)
    rewrite(ckpt, {"arrays/0.npy": members(ckpt)["arrays/0.npy"] + bytes(70_000)})
    with pytest.raises(ValueError, match=r"array 0 \(at KeyPath\('enc', 'w'\)\) is 70\d{3} "
                                         r"bytes, but its record says float32 \(3, 2\), 24 "
                                         r"bytes of data"):
        load(ckpt, like=tree)


def test_document_larger_than_like_can_need_is_refused(ckpt: Any) -> None:
    """A stored document (valid JSON, padded with 16 MiB of spaces) is refused before it is
    read: its size is bounded by 4 times like's own document plus 1 MiB."""
    tree = trained(ckpt)
    padded = members(ckpt)["checkpoint.json"] + CHUNK * 16
    rewrite(ckpt, {"checkpoint.json": padded})
    with pytest.raises(ValueError, match=r"checkpoint.json is 1677\d{4} bytes, more than the "
                                         r"10\d{5} that a tree like `like` can need"):
        load(ckpt, like=tree)
    rewrite(ckpt, {"checkpoint.json": members(ckpt)["checkpoint.json"][:-len(CHUNK) * 16]})
    assert load(ckpt, like=tree)["enc"]["w"].rule == Adam(0.1)


def test_document_cap_grows_with_like(tmp_path: Any) -> None:
    """A tree whose document is larger than the 1 MiB base (2,000 Leafs under long names)
    loads: the cap is proportional to what like needs, not a constant."""
    big = {f"layer_{i}_{'x' * 300}": np.ones(1) for i in range(2_000)}
    save(tmp_path / "big.ckpt", setup(Descent(0.123456789), big))
    assert len(members(tmp_path / "big.ckpt")["checkpoint.json"]) > 1 << 20
    back = load(tmp_path / "big.ckpt", like=setup(Descent(), big))
    assert back[f"layer_7_{'x' * 300}"].rule == Descent(0.123456789)


# ----------------------------------------------------------------------------- device files


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero and symlinks")
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_symlink_to_a_device_is_refused_quickly(tmp_path: Any, device: str) -> None:
    link = tmp_path / "opt.ckpt"
    link.symlink_to(device)
    text, peak = load_in_child(link, timeout=20)
    assert text.startswith("REFUSED") and "is not a regular file" in text, text
    assert peak < PEAK_MB


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_refused_without_blocking(tmp_path: Any) -> None:
    fifo = tmp_path / "opt.ckpt"
    os.mkfifo(fifo)
    text, _ = load_in_child(fifo, timeout=20)
    assert text.startswith("REFUSED") and "is not a regular file" in text, text


def test_directory_is_an_os_error(tmp_path: Any) -> None:
    with pytest.raises(IsADirectoryError):
        load(tmp_path, like=None)


# ----------------------------------------------------------------------------- records


def test_array_index_reused_for_another_record_is_refused(ckpt: Any) -> None:
    """enc.b's moment records keep their own dtype and shape but point at enc.w's arrays:
    a crafted file must not load enc.w's float32 (3, 2) moment as enc.b's float64 (2,)."""
    tree = trained(ckpt)

    def reuse(d: dict) -> None:
        w, b = (leaf["state"]["tuple"] for leaf in d["leaves"])
        b[0]["array"], b[1]["array"] = w[0]["array"], w[1]["array"]

    edit_json(ckpt, reuse)
    text, _ = load_in_child(ckpt)
    assert text.startswith("REFUSED") and "array 0 is used at KeyPath('enc', 'b')" in text, text
    with pytest.raises(ValueError, match=r"like does not share one array there, or the records "
                                         r"differ"):
        load(ckpt, like=tree)


def test_array_index_reused_with_an_agreeing_record_needs_like_to_share(ckpt: Any) -> None:
    """Two Leafs whose states share one array round trip when like shares it too; against
    a like with two arrays there, the reused index is refused though the records agree."""
    v = np.arange(3.0)
    shared = {"a": Leaf(Nested(), v), "b": Leaf(Nested(), v)}  # a rule that is never fused
    save(ckpt, shared)
    assert document(ckpt)["arrays"] == 1
    back = load(ckpt, like=shared)
    assert back["a"].state is back["b"].state and np.array_equal(back["a"].state, v)
    separate = {"a": Leaf(Nested(), np.ones(3)), "b": Leaf(Nested(), np.ones(3))}
    with pytest.raises(ValueError, match=r"array 0 is used at KeyPath\('b'\), state and at "
                                         r"KeyPath\('a'\), state, but like does not share"):
        load(ckpt, like=separate)


def test_hyperparameter_array_shared_by_every_rule_round_trips(ckpt: Any) -> None:
    eta = np.float32(0.5)
    tree = setup(Descent(eta), {"a": np.ones(2, np.float32), "b": np.ones(3, np.float32)})
    save(ckpt, tree)
    back = load(ckpt, like=setup(Descent(), {"a": np.ones(2, np.float32),
                                             "b": np.ones(3, np.float32)}))
    assert back["a"].rule.eta == eta and type(back["b"].rule.eta) is np.float32


def test_duplicate_member_names_are_refused(ckpt: Any) -> None:
    tree = trained(ckpt)
    found = members(ckpt)
    with pytest.warns(UserWarning, match="Duplicate name"):
        with zipfile.ZipFile(ckpt, "a") as zf:
            zf.writestr("arrays/0.npy", found["arrays/0.npy"])
    with pytest.raises(ValueError, match=r"two members named 'arrays/0.npy'"):
        load(ckpt, like=tree)


# ----------------------------------------------------------------------------- any depth


@pytest.mark.parametrize("kind", [list, tuple, dict])
def test_deep_tree_that_saves_also_loads(ckpt: Any, kind: type) -> None:
    """A state tree 3,000 containers deep (far past Python's recursion limit) saves and
    loads, sharing kept."""
    leaf = Leaf(Adam(0.25), Adam().init(np.ones(2)))
    tree: Any = leaf
    for i in range(3_000):
        tree = {"k": tree, "tie": leaf} if kind is dict and i == 0 else (
            {"k": tree} if kind is dict else kind([tree]))
    save(ckpt, tree)
    back = load(ckpt, like=tree)
    node = back
    for _ in range(2_999):
        node = node["k"] if kind is dict else node[0]
    assert node["k"] is node["tie"] if kind is dict else node[0].rule == Adam(0.25)


def test_model_nested_to_the_limit_saves_and_loads_in_a_fresh_process(tmp_path: Any) -> None:
    """The issue's case, as a user meets it: setup, save, then load in a new process, with
    no import before the deep walk; a model deeper than the walks take (490 lists, which
    setup's walk met Python's recursion limit at while importing the NumPy backend) is a
    ValueError naming the path (tests/test_walk.py tests each walk)."""
    code = f"""
        import numpy as np
        from optimisers import Adam, load, save, setup
        from optimisers.walk import MAX_DEPTH
        def nest(n):
            m = np.ones(2)
            for _ in range(n):
                m = [m]
            return m
        m = nest(MAX_DEPTH)
        save({str(tmp_path / 'deep.ckpt')!r}, setup(Adam(0.5), m))
        back = load({str(tmp_path / 'deep.ckpt')!r}, like=setup(Adam(), m))
        for _ in range(MAX_DEPTH):
            back = back[0]
        print(back.rule)
        try:
            setup(Adam(), nest(490))
        except ValueError as e:
            print(str(e)[:62])
    """
    rc, text, _ = run_child(code)
    assert rc == 0 and text.strip().splitlines() == [
        "Adam(eta=0.5, beta=(0.9, 0.999), epsilon=1e-08)",
        "the model is nested more than 100 containers deep: the list at"], text


def test_value_nested_past_the_limit_is_refused_at_save_and_at_load(ckpt: Any) -> None:
    deep: Any = 1
    for _ in range(150):
        deep = [deep]
    with pytest.raises(ValueError, match=r"cannot save Nested.extra at KeyPath\('w'\): it "
                                         r"nests .* more than 100 levels deep, which load "
                                         r"would refuse"):
        save(ckpt, setup(Nested(deep), {"w": np.ones(1)}))
    assert not ckpt.exists()
    deepest: Any = 1
    for _ in range(120):  # the deepest value that save writes, load reads back
        try:
            save(ckpt, setup(Nested([deepest]), {"w": np.ones(1)}))
        except ValueError:
            break
        deepest = [deepest]
    else:
        pytest.fail("save wrote a value nested 120 levels deep")
    assert load(ckpt, like=setup(Nested(), {"w": np.ones(1)}))["w"].rule == Nested(deepest)
    save(ckpt, setup(Nested([[1]]), {"w": np.ones(1)}))

    def nest(d: dict) -> None:
        field = d["leaves"][0]["rule"]["fields"]
        for _ in range(150):
            field["extra"] = {"list": [field["extra"]]}

    edit_json(ckpt, nest)
    with pytest.raises(ValueError, match=r"a value at KeyPath\('w'\) nests more than 100 "
                                         r"levels deep"):
        load(ckpt, like=setup(Nested(), {"w": np.ones(1)}))


def test_version_1_files_still_load(ckpt: Any) -> None:
    """A file in the nested format of version 1 (as save wrote before) loads as before."""
    tree = trained(ckpt)
    doc = document(ckpt)
    nodes = doc.pop("nodes")

    def nested(i: int) -> Any:
        tag, body = next(iter(nodes[i].items())) if nodes[i] else (None, None)
        if tag == "dict":
            return {"dict": [[k, nested(c)] for k, c in body]}
        return {tag: [nested(c) for c in body]} if tag in ("tuple", "list") else nodes[i]

    doc.update(version=1, tree=nested(0))
    rewrite(ckpt, {"checkpoint.json": json.dumps(doc).encode()})
    back = load(ckpt, like=setup(Adam(), model()))
    assert back["enc"]["w"].rule == Adam(0.1)
    assert np.array_equal(back["enc"]["b"].state[0], tree["enc"]["b"].state[0])


def test_node_referenced_twice_is_refused(ckpt: Any) -> None:
    trained(ckpt)

    def twice(d: dict) -> None:
        pairs = d["nodes"][1]["dict"]
        pairs[1][1] = pairs[0][1]

    edit_json(ckpt, twice)
    with pytest.raises(ValueError, match=r"malformed: a node reference 2 at KeyPath\('enc', "
                                         r"'b'\) \(each node is referenced once\)"):
        load(ckpt, like=setup(Adam(), model()))


# ----------------------------------------------------------------------------- temporary files


def temporaries(folder: Any) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))


@pytest.mark.skipif(os.name != "posix", reason="kills a process with SIGKILL")
def test_temp_file_of_a_killed_save_is_removed_by_the_next_save(ckpt: Any) -> None:
    """A save killed mid-write leaves its temporary file; the next save of that target
    removes it (a temporary file of another target, or of a save still running, stays)."""
    code = f"""
        import numpy as np
        from optimisers import Descent, Leaf, save
        tree = {{"w": Leaf(Descent(), [np.ones(1 << 18) for _ in range(100)])}}
        print("ready", flush=True)
        while True:
            save({str(ckpt)!r}, tree)
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 60
        while not temporaries(ckpt.parent) and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    left = temporaries(ckpt.parent)
    assert len(left) == 1 and left[0].startswith(".opt.ckpt."), left
    other = ckpt.parent / ".other.ckpt.0123456789ab.tmp"
    other.write_bytes(b"not ours")
    running = ckpt.parent / ".opt.ckpt.abcdef012345.tmp"
    with open(running, "wb") as held:  # a save in progress holds its temporary file's lock
        import fcntl

        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        tree = setup(Descent(), {"w": np.ones(1)})
        save(ckpt, tree)
    assert temporaries(ckpt.parent) == sorted([other.name, running.name])
    assert load(ckpt, like=tree)["w"].rule == Descent()


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_a_save_running_alongside_never_takes_the_other_ones_temporary_file(
        ckpt: Any, monkeypatch: Any) -> None:
    """A second save to the same target, running while the first has written its file but
    not yet renamed it, leaves the first one's temporary file alone (it is still locked)."""
    real = os.replace
    first, second = setup(Descent(0.1), model()), setup(Descent(0.2), model())

    def alongside(src: Any, dst: Any) -> None:
        monkeypatch.setattr(os, "replace", real)
        save(ckpt, second)  # runs its clean-up of abandoned files now
        real(src, dst)

    monkeypatch.setattr(os, "replace", alongside)
    save(ckpt, first)
    assert load(ckpt, like=first)["enc"]["w"].rule == Descent(0.1)  # the last rename wins
    assert temporaries(ckpt.parent) == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_save_keeps_the_permissions_of_the_file_it_replaces(ckpt: Any) -> None:
    tree = trained(ckpt)
    os.chmod(ckpt, 0o640)
    save(ckpt, tree)
    assert stat.S_IMODE(os.stat(ckpt).st_mode) == 0o640


@pytest.mark.skipif(os.name != "posix", reason="symlinks")
def test_save_writes_through_a_symlink(tmp_path: Any) -> None:
    """The link stays a link; the file it points to gets the new checkpoint."""
    (tmp_path / "runs").mkdir()
    real = tmp_path / "runs" / "step1.ckpt"
    link = tmp_path / "latest.ckpt"
    trained(real)
    link.symlink_to(real)
    tree = setup(Descent(0.5), model())
    save(link, tree)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert load(real, like=tree)["enc"]["w"].rule == Descent(0.5)
    assert temporaries(tmp_path) == [] and temporaries(real.parent) == []
    dangling = tmp_path / "next.ckpt"
    dangling.symlink_to(tmp_path / "runs" / "step2.ckpt")
    save(dangling, tree)
    assert dangling.is_symlink() and load(dangling, like=tree)["enc"]["b"].rule == Descent(0.5)


def make_special(kind: str, where: Any) -> None:
    """Put a ``kind`` of file that is not a regular one at ``where``."""
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "directory":
        where.mkdir()
        (where / "keep.txt").write_text("kept")
    elif kind == "socket":
        import socket

        with socket.socket(socket.AF_UNIX) as sock:  # a relative name: AF_UNIX caps paths
            sock.bind(os.path.relpath(where))          # at 108 bytes
    elif kind == "device":  # a character device with /dev/null's numbers, made in tmp_path
        os.mknod(where, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.mark.skipif(os.name != "posix", reason="FIFOs, sockets, devices and symlinks")
@pytest.mark.parametrize("through_link", [False, True], ids=["at the path", "through a link"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "socket", "device"])
def test_save_never_replaces_what_is_not_a_regular_file(
        tmp_path: Any, monkeypatch: Any, kind: str, through_link: bool) -> None:
    """Saving to a device (as root, to /dev/null) replaced it with a regular file: save
    refuses, naming the path, and the thing at the path (or the link's target) stays."""
    if kind == "device" and (not hasattr(os, "mknod") or os.geteuid() != 0):
        pytest.skip("making a device node needs root")
    monkeypatch.chdir(tmp_path)
    special = tmp_path / "special"
    make_special(kind, special)
    before = os.lstat(special)
    path = special
    if through_link:
        path = tmp_path / "latest.ckpt"
        path.symlink_to(special)
    with pytest.raises(ValueError, match=rf"cannot save to '{path}'.*not a regular file"):
        save(path, setup(Descent(), model()))
    after = os.lstat(special)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        before.st_mode, before.st_ino, before.st_rdev)
    assert not through_link or os.readlink(path) == str(special)
    if kind == "directory":
        assert os.listdir(special) == ["keep.txt"]
    assert temporaries(tmp_path) == []


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_FSIZE and SIGXFSZ")
def test_save_that_fills_the_disk_leaves_no_temporary_file_and_the_old_checkpoint(
        ckpt: Any) -> None:
    """A write refused for size (EFBIG, as a full disk's ENOSPC) used to leave its temporary
    file: closing it flushed again, raised again, and the unlink never ran."""
    trained(ckpt)
    code = f"""
        import resource, signal
        import numpy as np
        from optimisers import Descent, Leaf, save
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        try:
            save({str(ckpt)!r}, {{"w": Leaf(Descent(), np.ones(1 << 18))}})  # 2 MiB
        except OSError as e:
            print("FAILED", e.errno)
    """
    rc, text, _ = run_child(code)
    assert rc == 0 and text.strip() == f"FAILED {errno.EFBIG}", text
    assert temporaries(ckpt.parent) == []
    back = load(ckpt, like=setup(Adam(), model()))
    assert back["enc"]["w"].rule == Adam(0.1) and back["enc"]["w"].clock == 1


# ----------------------------------------------------------------------------- no code first

BUILT: list[Any] = []


@dataclass(frozen=True)
class Recorded(Rule):
    """A user rule whose constructor leaves a trace."""

    eta: float = 0.1

    def __post_init__(self) -> None:
        BUILT.append(self.eta)

    def init(self, x: Any) -> Any:
        return np.zeros_like(x)

    def apply(self, state: Any, x: Any, dx: Any) -> tuple:
        return state, self.eta * dx


def test_no_rule_is_constructed_before_a_mismatch_is_reported(ckpt: Any) -> None:
    m = model()
    save(ckpt, setup(Recorded(0.5), m))
    BUILT.clear()
    with pytest.raises(ValueError, match=r"the file has the rule Recorded, like has Adam"):
        load(ckpt, like=setup(Adam(), m))
    assert BUILT == []
    like = setup(Recorded(), m)
    wrong = {"enc": {"w": like["enc"]["w"], "b": Leaf(Recorded(), np.zeros(4))}}
    BUILT.clear()
    with pytest.raises(ValueError, match=r"at KeyPath\('enc', 'b'\), state: the file has an "
                                         r"array of shape \(2,\) and dtype float64, like has "
                                         r"an array of shape \(4,\)"):
        load(ckpt, like=wrong)
    assert BUILT == []  # enc.w matched, but its rule waits for the whole tree
    back = load(ckpt, like=like)
    assert BUILT == [0.5, 0.5]  # once each Leaf, after the whole file matched like
    assert back["enc"]["w"].rule.eta == 0.5


def test_numpy_only_process_never_imports_torch_or_jax_because_of_a_file(ckpt: Any) -> None:
    """A file whose rule names a torch (or JAX) dtype is refused in a process that has not
    imported torch (JAX), and loading it imports neither."""
    m = model()
    save(ckpt, setup(MixedPrecision(Adam(), np.float32), m))
    for form in ("torch", "jax"):
        edit_json(ckpt, lambda d, form=form: [leaf["rule"]["fields"].update(
            dtype={"dtype": "float32", "as": form}) for leaf in d["leaves"]])
        code = f"""
            import sys
            import numpy as np
            from optimisers import Adam, MixedPrecision, load, setup
            m = {{"enc": {{"w": np.ones((3, 2), np.float32), "b": np.ones(2)}}}}
            try:
                load({str(ckpt)!r}, like=setup(MixedPrecision(Adam(), np.float32), m))
            except ValueError as e:
                print("REFUSED", e)
            print(sorted(n for n in ("torch", "jax") if n in sys.modules))
        """
        rc, text, _ = run_child(code)
        assert rc == 0 and f"has a {form} dtype 'float32', but this process has not imported" \
            in text and text.strip().endswith("[]"), text
