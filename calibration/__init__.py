"""Measuring a machine: microbenchmarks and the calibration run, power meters, the profile writer
(and its fits of raw points), and the real-run harness. What runs on a GPU has a CPU path.

Importing this package imports nothing heavy; torch is imported by the modules that need it.
"""

# Benchmark families, in the order the calibration runs them (see calibration.calibrate.plan).
FAMILIES = ("power", "wait_decay", "gemm", "attention", "hbm", "layer_elementwise", "vision_elementwise",
            "hostlink", "hostlink_both", "host_memory", "host_issue", "pass_issue", "zero3_hooks", "cpu_adam",
            "cpu_adam_threads", "param_refresh", "collective", "memory", "overlap", "ds_steps")
