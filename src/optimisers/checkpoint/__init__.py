"""Checkpoints: ``save`` and ``load`` a state tree, without pickle.

A checkpoint is one ZIP file (stored, not compressed; readable by ``numpy.load`` and
``unzip``) with these members:

``checkpoint.json``
    A UTF-8 JSON document::

        {"format": "optimisers.checkpoint", "version": 2,
         "nodes": [<node>, ...], "leaves": [<leaf>, ...], "arrays": <count>}

``arrays/<i>.npy``
    Array number ``i`` in NumPy's ``.npy`` format (header version 1.0 or 2.0, never an
    object dtype). A dtype that NumPy lacks (``bfloat16``, ``float8_*``) is stored as its
    bits, an unsigned integer array of the same item size.

``nodes`` is the state tree, flat, parents before children, ``nodes[0]`` its root (so a
tree of any depth is a shallow document). A ``<node>`` is ``null`` (no Leaf here),
``{"leaf": i}`` (entry ``i`` of ``leaves``; a tied Leaf is stored once and referenced from
every path to it), ``{"dict": [[<key>, n], ...]}``, ``{"tuple": [n, ...]}`` or
``{"list": [n, ...]}``, each child ``n`` the index of a node, every node but the root
referenced exactly once. (Version 1, still read, nested the nodes in one ``"tree"``.)
Each ``<leaf>`` is
``{"path": "layers.0.weight", "rule": <value>, "frozen": false, "state": <value>}``,
``path`` being the first key path that reaches it (for people; loading walks ``nodes``).

A ``<value>`` is JSON ``null``, ``true``/``false``, an integer or a string as itself,
or an object with one tag:

- ``{"float": "0.9"}``: a Python float by ``repr``, exact (``"inf"``, ``"nan"``, ``"-0.0"``);
  ``{"complex": ["1.0", "-2.5"]}``.
- ``{"tuple": [...]}``, ``{"list": [...]}``, ``{"dict": [[<key>, <value>], ...]}``.
- ``{"array": i, "dtype": "float32", "shape": [3, 2], "library": "torch"}``, plus
  ``"bits": "uint16"`` when stored as bits, ``"scalar": true`` for a NumPy scalar and
  ``"weak": true`` for a weakly-typed JAX scalar; one array object reached twice is
  stored once (loading accepts an index twice only with equal records, and only where
  ``like`` holds one array at both places or both are hyper-parameters).
- ``{"rule": "Adam", "fields": {"eta": <value>, "beta": <value>, ...}}``: a rule, by its
  class name in :data:`optimisers.RULES` and its constructor arguments (nested rules for
  :class:`OptimiserChain` and :class:`MixedPrecision`); ``{"schedule": "Cosine",
  "fields": {...}}``, a schedule in a rule's field, by its name in
  :data:`optimisers.SCHEDULES`.
- ``{"function": "module:qualified.name"}``: the function of a
  :class:`~optimisers.Function` schedule, by the name that imports it (``save`` refuses
  one without such a name: a lambda, a function made inside another); ``load`` takes the
  function of that name from ``like``'s rule at the same Leaf.
- ``{"dtype": "float32", "as": "type"}``: a dtype field, ``as`` one of ``"type"``
  (``np.float32``), ``"numpy"`` (``np.dtype("float32")``), ``"torch"``, ``"jax"``.

Values nest (tuples, lists, dicts, rules) at most 100 levels deep: ``save`` refuses deeper
ones, so that whatever ``save`` writes, ``load`` reads.

A file is untrusted input. Loading never unpickles, never executes code from the file and
never imports a name the file chooses: rules come from the registry
:data:`optimisers.RULES` (every subclass of :class:`Rule` registers itself when defined),
dtypes from a fixed list or from a library already imported, functions from ``like``;
the file's rule classes are compared with ``like``'s before any rule is constructed, and
rules are constructed only after the whole file matched ``like``. It reads regular files
only (never a device or a FIFO), members stored as is (a compressed or encrypted member, or
a name used twice, is refused), each array's member no larger than its record says, and a
``checkpoint.json`` of at most 4 times the size of ``like``'s own document plus 1 MiB.
"""

from optimisers.checkpoint.io import load, save
from optimisers.checkpoint.statedict import load_state_dict, state_dict

__all__ = ["save", "load", "state_dict", "load_state_dict"]
