"""Writes models/digits.npz (scikit-learn's bundled digits) and models/digits_init.onnx, an untrained CNN for
`dlnet train models/digits_train.yaml` (needs scikit-learn and torch)."""
import os

from dlnet.digits import digits_model, write_npz

here = os.path.dirname(os.path.abspath(__file__))
write_npz(os.path.join(here, "digits.npz"))
digits_model(os.path.join(here, "digits_init.onnx"))
