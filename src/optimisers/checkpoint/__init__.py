"""Checkpoints: ``save`` and ``load`` a state tree, without pickle.

A checkpoint is a ZIP file of stored members (``numpy.load`` and ``unzip`` read it): array
``i`` as ``arrays/<i>.npy`` (a dtype NumPy lacks, ``bfloat16``, as the unsigned integers of
its bits), and ``checkpoint.json``: ``{"format": "optimisers.checkpoint", "version": 2,
"nodes": [...], "leaves": [...], "arrays": <count>}``. ``nodes`` is the state tree flat,
parents first: ``null``, ``{"leaf": i}`` (a tied Leaf stored once), ``{"dict": [[<key>, n],
...]}``, ``{"tuple"|"list": [n, ...]}``. A leaf is ``{"path": "layers.0.weight", "rule":
<value>, "frozen": false, "clock": 3, "state": <value>}``; a value is JSON's own or a tagged
object (``_codec.VALUES``: ``{"float": "0.9"}``, ``{"array": i, "dtype": "float32",
"shape": [3], "library": "torch"}``, ``{"rule": "Adam", "fields": {...}}``, ...).

A file is untrusted: loading never unpickles, runs or imports what it names, builds rules
only after the whole file matched ``like``, and refuses what ``_archive.py`` finds amiss.
"""

from optimisers.checkpoint._migrate import LoadReport
from optimisers.checkpoint.io import load, save
from optimisers.checkpoint.statedict import load_state_dict, state_dict

__all__ = ["save", "load", "state_dict", "load_state_dict", "LoadReport"]
