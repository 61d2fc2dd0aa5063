"""The int8 conversion itself, run as a child process by ``int8.py`` (``python -m`` this module SRC DST):
optimize the model to its fp32 graph, then quantize that dynamically. Apart from ``int8.py`` so that the
``onnx`` package the quantizer imports never loads into a sidecar."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic


def convert(source: Path, target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="memlane-int8-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        opts = ort.SessionOptions()
        # Basic optimizations fold the stored int8 weights into fp32 constants and leave standard ONNX
        # operators, which the quantizer knows; the sidecar applies the rest when it loads the result.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(fp32)
        ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        quantize_dynamic(fp32, target, per_channel=True, reduce_range=True, weight_type=QuantType.QUInt8)


if __name__ == "__main__":
    logging.disable(logging.WARNING)  # the quantizer's advice to pre-process is for calibrated models
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
