"""optimisers: functional optimisers for nested models.

``setup(rule, model)`` builds a tree of optimiser states mirroring the model;
``update`` / ``update_`` take one step. Models may hold NumPy, PyTorch or JAX arrays in
any nesting of containers, dataclasses and registered classes, up to
``optimisers.walk.MAX_DEPTH`` (100) containers deep. Examples assume ``import numpy as np``.
"""

from optimisers.adjust import adjust, adjust_, freeze_, select, thaw_
from optimisers.averaged import averaged
from optimisers.checkpoint import LoadReport, load, load_state_dict, save, state_dict
from optimisers.destructure import Restructure, destructure, trainables
from optimisers.keypath import KeyPath, getkeypath, haskeypath
from optimisers.lrfind import LRRange, lr_find
from optimisers.plateau import Plateau, observe, observe_
from optimisers.reinit import reinit
from optimisers.rules import (
    ADOPT,
    EMA,
    LAMB,
    LARS,
    RULES,
    AccumGrad,
    AdaBelief,
    AdaDelta,
    Adafactor,
    AdaGrad,
    Adam,
    AdaMax,
    AdamW,
    AMSGrad,
    ClipGlobalNorm,
    ClipGrad,
    ClipNorm,
    Descent,
    Lion,
    LowPrecision,
    MixedPrecision,
    Momentum,
    Muon,
    NAdam,
    Nesterov,
    NewValue,
    OAdam,
    OptimiserChain,
    Quantised,
    RAdam,
    RMSProp,
    Rprop,
    Rule,
    ScheduleFreeAdamW,
    SignDecay,
    SkipNonFinite,
    StochasticRounding,
    TreeRule,
    WeightDecay,
)
from optimisers.schedules import (
    SCHEDULES,
    Constant,
    Cosine,
    Exponential,
    Function,
    Join,
    Linear,
    OneCycle,
    Polynomial,
    Scaled,
    Schedule,
    Step,
    Warmup,
)
from optimisers.state import Leaf, setup, update, update_
from optimisers.summary import summary
from optimisers.telemetry import LeafStats, plot_ratios
from optimisers.tree import (
    children,
    functor,
    isleaf,
    ismutable,
    isnumeric,
    maywrite,
    rebuild,
    register,
    trainable,
)
from optimisers.walk import fleaves, fmap, fmap_with_path, fmapstructure

__version__ = "0.1.0"

__all__ = ["AccumGrad", "AdaBelief", "AdaDelta", "Adafactor", "AdaGrad", "Adam", "AdaMax", "AdamW",
           "AMSGrad", "ClipGrad", "ClipNorm", "Descent", "EMA", "averaged", "KeyPath", "Leaf",
           "Lion", "LowPrecision", "MixedPrecision", "Momentum", "Muon", "NAdam", "Nesterov",
           "NewValue", "OAdam", "OptimiserChain", "Quantised", "RAdam", "Restructure", "RMSProp",
           "Rprop", "Rule", "RULES", "SignDecay", "WeightDecay", "adjust", "adjust_",
           "ClipGlobalNorm", "SkipNonFinite", "StochasticRounding", "TreeRule", "ADOPT", "LAMB",
           "LARS", "ScheduleFreeAdamW", "Constant", "Cosine", "Exponential", "Function", "Join",
           "Linear", "OneCycle", "Plateau", "Polynomial", "Scaled", "Schedule", "SCHEDULES",
           "Step", "Warmup", "children", "destructure", "fleaves", "fmap", "fmap_with_path",
           "fmapstructure", "freeze_", "functor", "getkeypath", "haskeypath", "isleaf",
           "ismutable", "isnumeric", "load", "maywrite", "observe", "observe_", "rebuild",
           "register", "reinit", "save", "select", "setup", "summary", "thaw_", "state_dict",
           "load_state_dict", "trainable", "trainables", "update", "update_", "LeafStats",
           "plot_ratios", "LRRange", "lr_find", "LoadReport"]
