"""Numbers before graphs: the quantized element types (ranges, the opset and IR version that
introduced them, packing to and from TensorProto) and the QuantizeLinear / DequantizeLinear
arithmetic in numpy (broadcasting, rounding, saturation, choice of scale and zero point).
"""
