"""Writes models/digits.npz and models/digits.onnx (needs scikit-learn and torch)."""
import os

from dlnet.digits import digits_model, write_npz

here = os.path.dirname(os.path.abspath(__file__))
write_npz(os.path.join(here, "digits.npz"))
digits_model(os.path.join(here, "digits.onnx"))
