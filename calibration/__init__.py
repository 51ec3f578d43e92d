"""Everything that touches a GPU: microbenchmarks, power meters, the calibration run, the real-run harness.

Importing this package imports nothing heavy; torch is imported by the modules that need it.
"""

# Benchmark families, in the order the calibration runs them (see calibration.calibrate.plan).
FAMILIES = ("power", "gemm", "attention", "hbm", "hostlink", "hostlink_both", "host_memory", "cpu_adam",
            "cpu_adam_threads", "collective", "memory", "overlap")
