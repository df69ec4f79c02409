"""The exactness suite's parts: models, loop patterns, feature adapters, comparison, cells.

stowage never changes what a training step computes: each cell runs a model through a loop
pattern with one of stowage's features and with plain torch, from the same seed and state, and
compares losses, parameters, gradients, optimizer states, buffers and the RNG stream (bitwise,
or within torch's own fused-vs-foreach difference for the host optimizer), or checks that the
feature refused where it may. tests/python/test_exactness.py runs the matrix under pytest in CPU
mode, tests/gpu/python/test_exactness_gpu.py on a GPU (the same harness, ``Config.device``;
devices.py holds what differs per device, suite.py the pytest side both share);
``python tests/python/exactness/matrix.py [--device cuda]`` prints it as a table.
"""
