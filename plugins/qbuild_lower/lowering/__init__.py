"""The lowering pass: ``driver.lower_model`` visits every compute node and lowers its
DQ -> op -> Q group with the handlers of the target mode, ``ort`` (integer operators
onnxruntime runs) or ``fixed_point`` (standard ONNX integer operators, int32 multipliers
and rounding shifts; its accumulators in ``accumulator``, its parameter records for
``fixed_point_params.json`` in ``records``)."""
