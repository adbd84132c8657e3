"""The fast paths: fused groups of Leafs and the code generator that compiles rules."""
