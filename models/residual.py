"""A learned correction on top of the fitted cost model, and the uncertainty band it gives.

The fitted profile leaves residuals the model's structure cannot express (a DeepSpeed code path
slower than its bytes, a kernel choice at one shape). A Gaussian process on log(measured /
predicted) learns them from where the prediction says the time goes (phase shares) and what the
strategy is (ZeRO stage, offload kind, Ulysses, checkpointing, model size, tokens per GPU).

Extrapolation is explicit: the GP's prior mean is zero, so far from the training runs the
correction fades to none (the fitted profile alone) and the band widens to the prior's width,
rather than carrying a correction learned on one family over to another. With few runs that is
the honest answer: the band says how little is known there.
"""
from __future__ import annotations

import warnings

import numpy as np
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
from sklearn.preprocessing import StandardScaler

from models.fit import MeasuredRun, RunPredictions
from models.params import count_params

COMPUTE = ("compute", "attention", "elementwise", "recompute", "vision_compute", "vision_recompute")
COMM = ("zero_comm", "ulysses_all_to_all", "overlap_contention")
FEATURES = ("zero_stage", "offload_optimizer", "super_offload", "offload_param", "checkpointing", "log2_sp",
            "log2_gpus", "log10_params", "log2_tokens_per_gpu", "share_compute", "share_comm", "share_host",
            "share_cpu_optimizer", "share_overhead")


def features(runs: list[MeasuredRun], predictions: RunPredictions) -> np.ndarray:
    """One row per run, columns as FEATURES: what the strategy is and where predicted time goes."""
    rows = []
    step = np.where(predictions.step_time_s > 0, predictions.step_time_s, 1.0)
    ph = predictions.phase_time_s

    def share(names, i):
        return sum(float(ph[n][i]) for n in names if n in ph) / step[i]

    for i, run in enumerate(runs):
        s = run.strategy
        params = count_params(run.workload).trainable
        rows.append([
            s.zero_stage, s.offload_optimizer == "cpu", s.super_offload, s.offload_param == "cpu",
            s.checkpoint_every > 0, np.log2(s.sp), np.log2(s.gpus), np.log10(max(params, 1)),
            np.log2(s.micro_batch * run.workload.seq_len / s.sp), share(COMPUTE, i), share(COMM, i),
            share(("host_transfer",), i), share(("cpu_optimizer",), i),
            share(("deepspeed_overhead", "optimizer_gpu"), i),
        ])
    return np.asarray(rows, dtype=float)


class ResidualModel:
    """Correction factor and band for one metric ("step_time_s" or "gpu_energy_j").

    scikit-learn shape: __init__ stores settings, fit() returns self, fitted state ends in _.
    `prior_std` is the log-ratio spread assumed before any run (0.1: about 10%), which is also
    the band's half-width, at `level`, far from the training runs.
    """

    def __init__(self, metric: str = "step_time_s", level: float = 0.9, prior_std: float = 0.1,
                 random_state: int = 0):
        assert metric in ("step_time_s", "gpu_energy_j"), metric
        self.metric = metric
        self.level = level
        self.prior_std = prior_std
        self.random_state = random_state

    def _targets(self, runs, predictions):
        measured = np.array([getattr(r, self.metric) or np.nan for r in runs], dtype=float)
        predicted = getattr(predictions, self.metric)
        return np.log(measured / predicted)

    def fit(self, runs: list[MeasuredRun], predictions: RunPredictions) -> ResidualModel:
        """Learn log(measured / predicted) of `runs` under the fitted profile's `predictions`."""
        y = self._targets(runs, predictions)
        ok = np.isfinite(y)
        if ok.sum() < 3:
            raise ValueError(f"a residual model needs at least 3 runs with {self.metric}, got {int(ok.sum())}")
        x = features(runs, predictions)[ok]
        self.scaler_ = StandardScaler().fit(x)
        var = self.prior_std**2
        kernel = (ConstantKernel(var, (var / 100, var * 4)) * RBF(3.0, (0.3, 100.0))
                  + WhiteKernel(var / 10, (1e-6, var)))
        gp = GaussianProcessRegressor(kernel, normalize_y=False, random_state=self.random_state, n_restarts_optimizer=1)
        with warnings.catch_warnings():
            # A hyperparameter at its bound is an answer here (no structure left: the signal
            # variance at its floor), not a failure.
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.gp_ = gp.fit(self.scaler_.transform(x), y[ok])
        self.n_runs_ = int(ok.sum())
        return self

    def predict(self, runs: list[MeasuredRun], predictions: RunPredictions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(corrected prediction, lower, upper) of the metric, the band at `level`."""
        mean, std = self.gp_.predict(self.scaler_.transform(features(runs, predictions)), return_std=True)
        base = getattr(predictions, self.metric)
        z = norm.ppf(0.5 + self.level / 2)
        return base * np.exp(mean), base * np.exp(mean - z * std), base * np.exp(mean + z * std)

    def to_dict(self) -> dict:
        """JSON-able: settings, the training rows and the fitted kernel; `from_dict` rebuilds the
        same predictions (the GP is refitted on these rows with the kernel held fixed)."""
        k = self.gp_.kernel_
        return {
            "metric": self.metric, "level": self.level, "prior_std": self.prior_std, "features": list(FEATURES),
            "x_mean": self.scaler_.mean_.tolist(), "x_scale": self.scaler_.scale_.tolist(),
            "x_train": self.gp_.X_train_.tolist(), "y_train": self.gp_.y_train_.tolist(),
            "kernel": {"signal_variance": float(k.k1.k1.constant_value), "length_scale": float(k.k1.k2.length_scale),
                       "noise_variance": float(k.k2.noise_level)},
        }

    @classmethod
    def from_dict(cls, data: dict) -> ResidualModel:
        if data["features"] != list(FEATURES):
            raise ValueError(f"residual model built on features {data['features']}, this version has {list(FEATURES)}")
        model = cls(data["metric"], data["level"], data["prior_std"])
        model.scaler_ = StandardScaler()
        model.scaler_.mean_ = np.asarray(data["x_mean"])
        model.scaler_.scale_ = np.asarray(data["x_scale"])
        model.scaler_.var_ = model.scaler_.scale_**2
        model.scaler_.n_features_in_ = len(FEATURES)
        kern = data["kernel"]
        kernel = (ConstantKernel(kern["signal_variance"], "fixed") * RBF(kern["length_scale"], "fixed")
                  + WhiteKernel(kern["noise_variance"], "fixed"))
        model.gp_ = GaussianProcessRegressor(kernel, normalize_y=False, optimizer=None).fit(
            np.asarray(data["x_train"]), np.asarray(data["y_train"]))
        model.n_runs_ = len(data["y_train"])
        return model
