"""Running a test's worker in several processes on this machine: torch.distributed with the
gloo backend (CPU only), each run bounded in time."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = 120.0
"""Seconds a run may take before its processes are killed and the test fails."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fn, world: int, *args, timeout: float = TIMEOUT) -> None:
    """``fn(rank, world, *args)`` in ``world`` spawned processes, each in a gloo process
    group (``MASTER_ADDR=127.0.0.1``, a free port); an exception in any of them fails the
    caller with its traceback; after ``timeout`` seconds all are killed."""
    context = mp.start_processes(_main, args=(fn, world, free_port(), args), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{fn.__name__} on {world} processes took over {timeout} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()


def _main(rank: int, fn, world: int, port: int, args: tuple) -> None:
    """One worker: ``fn`` in a gloo process group. On success it leaves by ``os._exit``,
    past the interpreter's teardown: a group held by DDP's reducer or FSDP's device mesh
    outlives ``destroy_process_group``, and when one of its worker threads frees a finished
    collective's tensor during that teardown it must take the GIL, which then ends the
    thread by a forced unwind through a C++ destructor: ``std::terminate`` and SIGABRT
    ("terminate called without an active exception"). An exception still takes torch's
    own way out, which writes its traceback for the parent first."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two processes share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    leave()


def leave() -> None:
    """End this process now with status 0, its output flushed, without the interpreter's
    teardown (see ``_main``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_script(path: str, timeout: float = TIMEOUT) -> str:
    """Run the Python file ``path`` (which may spawn processes of its own) in a new
    session; its standard output. After ``timeout`` seconds the whole session is killed."""
    import signal
    import subprocess

    process = subprocess.Popen([sys.executable, path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise TimeoutError(f"{path} took over {timeout} s") from None
    if process.returncode:
        raise AssertionError(f"{path} exited with {process.returncode}:\n{err}")
    return out
