"""TensorFlow's DataType codes (docs/TF_FORMAT.md): their names, and the numpy
dtype each is read as. The one table the reader (bundle.py), the writer
(writer.py) and the conversions (convert.py) share."""

from __future__ import annotations

import numpy as np

from ..._dtypes import dtype_from_name

__all__ = ["DTYPES", "TF_DTYPE_NAMES", "STRING", "VARIANT", "OBJECT", "numpy_dtype"]

STRING = 7
VARIANT = 21

#: TensorFlow DataType -> pyckpt dtype name (quantized types read as their integers)
DTYPES: dict[int, str] = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 8: "complex64",
    9: "int64", 10: "bool", 11: "int8", 12: "uint8", 13: "int32", 14: "bfloat16", 15: "int16",
    16: "uint16", 17: "uint16", 18: "complex128", 19: "float16", 22: "uint32", 23: "uint64",
    24: "float8_e5m2", 25: "float8_e4m3fn", 26: "float8_e4m3fnuz", 27: "float8_e4m3b11fnuz",
    28: "float8_e5m2fnuz",
}
#: TensorFlow's own names of its dtypes, for messages and ``describe``
TF_DTYPE_NAMES: dict[int, str] = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32",
    14: "bfloat16", 15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128", 19: "float16",
    20: "resource", 21: "variant", 22: "uint32", 23: "uint64", 24: "float8_e5m2",
    25: "float8_e4m3fn", 26: "float8_e4m3fnuz", 27: "float8_e4m3b11fnuz", 28: "float8_e5m2fnuz",
    29: "int4", 30: "uint4", 31: "int2", 32: "uint2", 33: "float4_e2m1fn",
}
#: the numpy dtype of tensors without a numpy type of their own (string, variant, ...)
OBJECT = np.dtype(object)


def numpy_dtype(code: int, big_endian: bool) -> np.dtype | None:
    """The numpy dtype TensorFlow DataType ``code`` is read as: its numbers' dtype
    (in big-endian byte order for a big-endian checkpoint), ``OBJECT`` for a known
    dtype without a numpy type, None for an unknown code. ValueError when the
    dtype needs ml_dtypes and it is missing."""
    name = DTYPES.get(code)
    if name is None:
        return OBJECT if code in TF_DTYPE_NAMES else None
    dtype = dtype_from_name(name)
    if big_endian and dtype.kind in "biufc" and dtype.itemsize > 1:
        dtype = dtype.newbyteorder(">")
    return dtype
