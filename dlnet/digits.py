"""scikit-learn's bundled digits as arrays and a small CNN for them (tests, README and models/digits_train.yaml)."""
import numpy as np


def digits_arrays():
    """x: float32 [1797, 1, 8, 8] scaled to [0, 1]; y: int64 labels."""
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8), d.target.astype(np.int64)


def write_npz(path):
    x, y = digits_arrays()
    np.savez_compressed(path, x=x, y=y)


def digits_model(path, seed=0):
    """Conv-BN-ReLU-MaxPool, Conv-ReLU-AveragePool, Linear: exported from torch as ONNX op-set 13."""
    import torch
    from torch import nn
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                          nn.Linear(32 * 2 * 2, 10))
    model.eval()
    torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), path, opset_version=13, dynamo=False,
                      do_constant_folding=False, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return path
