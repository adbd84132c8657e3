"""Peak memory of training steps with the step inside ``backward`` against ``backward`` then
``update_`` (PyTorch, CPU): in a fresh process for each, the peak resident set (Linux's
``VmHWM``, reset after ``setup`` and a first step) over three more steps, with glibc
returning every freed block over 64 KiB to the system.

    python benchmarks/backward_memory.py [layers] [width]
"""

import json
import os
import subprocess
import sys

CHILD = """
import sys, torch, optimisers as O
from optimisers.backends.torchhooks import step_in_backward
layers, width, hooked = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
tree = O.setup(O.AdamW(1e-3, lambd=0.01), net)
x = torch.randn(4, width)
if hooked:
    step_in_backward(tree, net)
net(x).sum().backward()  # (the first step makes the state's pages resident)
if not hooked:
    O.update_(tree, net)
    net.zero_grad(set_to_none=True)
def hwm():
    lines = open("/proc/self/status").read().splitlines()
    return next(int(line.split()[1]) for line in lines if line.startswith("VmHWM"))
open("/proc/self/clear_refs", "w").write("5")  # (the peak from here on)
before = hwm()
for _ in range(3):
    net(x).sum().backward()
    if not hooked:
        O.update_(tree, net)
        net.zero_grad(set_to_none=True)
print(before, hwm())
"""


def peak(layers: int, width: int, hooked: bool) -> tuple[int, int]:
    """``(resident KiB when the peak was reset, the peak over the steps)``."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # (freed memory leaves RSS)
    out = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(width),
                          "1" if hooked else "0"], capture_output=True, text=True, check=True,
                         env=env)
    before, after = map(int, out.stdout.split())
    return before, after


SETUP = """
import sys, torch, optimisers as O
layers, width = int(sys.argv[1]), int(sys.argv[2])
net = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
def hwm():
    lines = open("/proc/self/status").read().splitlines()
    return next(int(line.split()[1]) for line in lines if line.startswith("VmHWM"))
open("/proc/self/clear_refs", "w").write("5")
before = hwm()
tree = O.setup(O.AdamW(1e-3, lambd=0.01), net)
print(before, hwm())
"""


def setup_peak(layers: int, width: int) -> float:
    """How far ``setup`` of AdamW raises the peak resident set, in MiB (a fresh process)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", SETUP, str(layers), str(width)],
                         capture_output=True, text=True, check=True, env=env)
    before, after = map(int, out.stdout.split())
    return (after - before) / 1024


def main(layers: int = 8, width: int = 2048) -> dict:
    grads = layers * width * width * 4 / 2**20
    plain, hooked = peak(layers, width, False), peak(layers, width, True)
    return {"parameters (MiB)": grads, "gradients (MiB)": grads,
            "peak, backward then update_ (MiB)": plain[1] / 1024,
            "peak, step inside backward (MiB)": hooked[1] / 1024,
            "drop (MiB)": (plain[1] - hooked[1]) / 1024,
            "setup's peak over what it started with (MiB)": setup_peak(layers, width)}


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(main(*args), indent=1))
