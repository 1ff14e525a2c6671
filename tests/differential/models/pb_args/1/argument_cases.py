"""One row per pb_utils callable and bad argument: `CASES["<callable>:<case>"] = call(context)`.

The pb_args model runs a row in `execute` and answers with what it raised; the differential test
sends every row to Triton 2.51 and to pystub and compares (tests/differential/test_pb_args.py,
which also fails when pb_utils has a public callable without a row). `<callable>` is the public
name (`Class` for its constructor, `Class.method` for a method). This module imports nothing: the
model hands it pb_utils and numpy, and the test reads the row names without either.
"""

# Callables pystub has and Triton 2.51's pb_utils does not (or not under that name): their rows
# check that Triton has no such attribute and that pystub refuses the bad call with some error.
EXTENSIONS = frozenset({
    "InferenceResponse.parameters", "InferenceResponseSender", "InferenceTrace", "InferenceTrace.get_context",
    "Metric", "ResponseIterator", "ResponseIterator.cancel", "new_output_array", "get_multiplexed_model",
    "async_get_multiplexed_model", "get_multiplexed_model_id",
})


class Context:
    """The objects the rows call methods of, made on first use."""

    def __init__(self, pb, np, model_config):
        self.pb, self.np, self.model_config = pb, np, model_config
        self.request = None   # the request being executed (set by the model)

    def array(self):
        return self.np.zeros(2, self.np.float32)

    def tensor(self):
        return self.pb.Tensor("T", self.array())

    def response(self):
        return self.pb.InferenceResponse([self.tensor()])

    def bls_request(self):
        return self.pb.InferenceRequest(model_name="no_such_model", inputs=[self.tensor()],
                                        requested_output_names=["X"])

    def family(self, kind="COUNTER"):
        name = {"COUNTER": "pb_args_counter", "GAUGE": "pb_args_gauge", "HISTOGRAM": "pb_args_histogram"}[kind]
        return self.pb.MetricFamily(name, "pb_args " + kind.lower(), getattr(self.pb.MetricFamily, kind))

    def metric(self, kind="COUNTER"):
        if kind == "HISTOGRAM":
            return self.family(kind).Metric(labels={"row": "bad"}, buckets=[1.0, 2.0])
        return self.family(kind).Metric(labels={"row": "bad"})

    def config(self):
        return self.pb.ModelConfig(__import__("json").dumps(self.model_config))

    def iterator(self):
        inputs = [self.pb.Tensor("IN", self.np.array([0], self.np.int32))]
        return self.pb.InferenceRequest(model_name="repeat", inputs=inputs, requested_output_names=["OUT"]).exec(
            decoupled=True)


def _rows():
    def tensor_rows():
        return {
            "Tensor:no_arguments": lambda c: c.pb.Tensor(),
            "Tensor:name_none": lambda c: c.pb.Tensor(None, c.array()),
            "Tensor:name_int": lambda c: c.pb.Tensor(1, c.array()),
            "Tensor:data_none": lambda c: c.pb.Tensor("T", None),
            "Tensor:data_list": lambda c: c.pb.Tensor("T", [1.0, 2.0]),
            "Tensor:data_str": lambda c: c.pb.Tensor("T", "abc"),
            "Tensor.from_dlpack:name_none": lambda c: c.pb.Tensor.from_dlpack(None, c.array()),
            "Tensor.from_dlpack:tensor_none": lambda c: c.pb.Tensor.from_dlpack("T", None),
            "Tensor.name:extra_argument": lambda c: c.tensor().name(1),
            "Tensor.shape:extra_argument": lambda c: c.tensor().shape(1),
            "Tensor.triton_dtype:extra_argument": lambda c: c.tensor().triton_dtype(1),
            "Tensor.is_cpu:extra_argument": lambda c: c.tensor().is_cpu(1),
            "Tensor.as_numpy:extra_argument": lambda c: c.tensor().as_numpy(1),
            "Tensor.to_dlpack:extra_argument": lambda c: c.tensor().to_dlpack(1),
        }

    def request_rows():
        def make(**changes):
            def call(c):
                arguments = {"model_name": "no_such_model", "inputs": [c.tensor()], "requested_output_names": ["X"]}
                arguments.update(changes)
                return c.pb.InferenceRequest(**arguments)
            return call
        return {
            "InferenceRequest:no_arguments": lambda c: c.pb.InferenceRequest(),
            "InferenceRequest:model_name_none": make(model_name=None),
            "InferenceRequest:inputs_none": make(inputs=None),
            "InferenceRequest:inputs_of_none": make(inputs=[None]),
            "InferenceRequest:requested_output_names_none": make(requested_output_names=None),
            "InferenceRequest:requested_output_names_str": make(requested_output_names="X"),
            "InferenceRequest:request_id_none": make(request_id=None),
            "InferenceRequest:correlation_id_none": make(correlation_id=None),
            "InferenceRequest:correlation_id_float": make(correlation_id=1.5),
            "InferenceRequest:model_version_str": make(model_version="1"),
            "InferenceRequest:flags_str": make(flags="x"),
            "InferenceRequest:flags_negative": make(flags=-1),
            "InferenceRequest:timeout_none": make(timeout=None),
            "InferenceRequest:preferred_memory_int": make(preferred_memory=0),
            "InferenceRequest:preferred_memory_none": make(preferred_memory=None),
            "InferenceRequest:trace_str": make(trace="x"),
            "InferenceRequest:trace_none": make(trace=None),
            "InferenceRequest:parameters_list": make(parameters=[1]),
            "InferenceRequest:parameters_none": make(parameters=None),
            "InferenceRequest:unknown_keyword": make(bogus=1),
            "InferenceRequest.inputs:extra_argument": lambda c: c.request.inputs(1),
            "InferenceRequest.request_id:extra_argument": lambda c: c.request.request_id(1),
            "InferenceRequest.correlation_id:extra_argument": lambda c: c.request.correlation_id(1),
            "InferenceRequest.flags:extra_argument": lambda c: c.request.flags(1),
            "InferenceRequest.set_flags:str": lambda c: c.bls_request().set_flags("x"),
            "InferenceRequest.set_flags:none": lambda c: c.bls_request().set_flags(None),
            "InferenceRequest.timeout:extra_argument": lambda c: c.request.timeout(1),
            "InferenceRequest.parameters:extra_argument": lambda c: c.request.parameters(1),
            "InferenceRequest.requested_output_names:extra_argument": lambda c: c.request.requested_output_names(1),
            "InferenceRequest.trace:extra_argument": lambda c: c.request.trace(1),
            "InferenceRequest.get_response_sender:extra_argument": lambda c: c.request.get_response_sender(1),
            "InferenceRequest.is_cancelled:extra_argument": lambda c: c.request.is_cancelled(1),
            "InferenceRequest.set_release_flags:str": lambda c: c.request.set_release_flags("x"),
            "InferenceRequest.set_release_flags:none": lambda c: c.request.set_release_flags(None),
            "InferenceRequest.exec:decoupled_str": lambda c: c.bls_request().exec(decoupled="yes"),
            "InferenceRequest.exec:decoupled_none": lambda c: c.bls_request().exec(decoupled=None),
            "InferenceRequest.async_exec:decoupled_str": lambda c: c.bls_request().async_exec(decoupled="yes"),
        }

    def response_rows():
        return {
            "InferenceResponse:output_tensors_none": lambda c: c.pb.InferenceResponse(output_tensors=None),
            "InferenceResponse:output_tensors_of_none": lambda c: c.pb.InferenceResponse([None]),
            "InferenceResponse:output_tensors_str": lambda c: c.pb.InferenceResponse("T"),
            "InferenceResponse:output_tensors_tensor": lambda c: c.pb.InferenceResponse(c.tensor()),
            "InferenceResponse:error_str": lambda c: c.pb.InferenceResponse(error="failed"),
            "InferenceResponse:error_int": lambda c: c.pb.InferenceResponse([], 1),
            "InferenceResponse.output_tensors:extra_argument": lambda c: c.response().output_tensors(1),
            "InferenceResponse.has_error:extra_argument": lambda c: c.response().has_error(1),
            "InferenceResponse.error:extra_argument": lambda c: c.response().error(1),
            "InferenceResponse.parameters:extra_argument": lambda c: c.response().parameters(1),
        }

    def sender_rows():
        return {
            "InferenceResponseSender:no_arguments": lambda c: c.pb.InferenceResponseSender(),
            "InferenceResponseSender.send:response_str": lambda c: c.request.get_response_sender().send("x"),
            "InferenceResponseSender.send:response_int": lambda c: c.request.get_response_sender().send(response=1),
            "InferenceResponseSender.send:flags_str": lambda c: c.request.get_response_sender().send(flags="x"),
            "InferenceResponseSender.send:flags_negative":
                lambda c: c.request.get_response_sender().send(c.response(), flags=-1),
            "InferenceResponseSender.send:flags_float":
                lambda c: c.request.get_response_sender().send(c.response(), 1.0),
            "InferenceResponseSender.is_cancelled:extra_argument":
                lambda c: c.request.get_response_sender().is_cancelled(1),
        }

    def error_rows():
        return {
            "TritonError:no_arguments": lambda c: c.pb.TritonError(),
            "TritonError:message_none": lambda c: c.pb.TritonError(None),
            "TritonError:message_int": lambda c: c.pb.TritonError(1),
            "TritonError:code_str": lambda c: c.pb.TritonError("m", "INTERNAL"),
            "TritonError:code_int": lambda c: c.pb.TritonError("m", 2),
            "TritonError:code_none": lambda c: c.pb.TritonError("m", None),
            "TritonError.message:extra_argument": lambda c: c.pb.TritonError("m").message(1),
            "TritonError.code:extra_argument": lambda c: c.pb.TritonError("m").code(1),
            "TritonModelException:message_none": lambda c: c.pb.TritonModelException(None),
        }

    def logger_rows():
        return {
            "Logger:extra_argument": lambda c: c.pb.Logger(1),
            "Logger.log:message_none": lambda c: c.pb.Logger.log(None),
            "Logger.log:level_str": lambda c: c.pb.Logger.log("m", "Invalid Level"),
            "Logger.log:level_int": lambda c: c.pb.Logger.log("Invalid Level", 1),
            "Logger.log:level_none": lambda c: c.pb.Logger.log("m", None),
            "Logger.log_info:message_none": lambda c: c.pb.Logger.log_info(None),
            "Logger.log_info:message_int": lambda c: c.pb.Logger.log_info(1),
            "Logger.log_warn:message_none": lambda c: c.pb.Logger.log_warn(None),
            "Logger.log_error:message_none": lambda c: c.pb.Logger.log_error(None),
            "Logger.log_verbose:message_none": lambda c: c.pb.Logger.log_verbose(None),
        }

    def metric_rows():
        return {
            "MetricFamily:name_none": lambda c: c.pb.MetricFamily(None, "d", c.pb.MetricFamily.COUNTER),
            "MetricFamily:description_none": lambda c: c.pb.MetricFamily("pb_args_x", None, c.pb.MetricFamily.COUNTER),
            "MetricFamily:kind_str": lambda c: c.pb.MetricFamily("pb_args_x", "d", "COUNTER"),
            "MetricFamily:kind_int": lambda c: c.pb.MetricFamily("pb_args_x", "d", 0),
            "MetricFamily:kind_none": lambda c: c.pb.MetricFamily("pb_args_x", "d", None),
            "MetricFamily.Metric:labels_str": lambda c: c.family().Metric(labels="x"),
            "MetricFamily.Metric:buckets_on_counter": lambda c: c.family().Metric(labels={}, buckets=[1.0]),
            "MetricFamily.Metric:buckets_str": lambda c: c.family("HISTOGRAM").Metric(labels={}, buckets="x"),
            "MetricFamily.Metric:buckets_of_str": lambda c: c.family("HISTOGRAM").Metric(labels={}, buckets=["a"]),
            # No second such row, and none with labels that are not strings: Triton 2.51's server
            # dies (boost lock_exception) after such refusals, not every time.
            "MetricFamily.Metric:buckets_repeated":
                lambda c: c.family("HISTOGRAM").Metric(labels={}, buckets=[1, 1, 2, 5, 5]),
            "MetricFamily.Metric:buckets_missing": lambda c: c.family("HISTOGRAM").Metric(labels={}),
            "Metric:no_arguments": lambda c: c.pb.Metric(),
            "Metric.increment:str": lambda c: c.metric().increment("x"),
            "Metric.increment:none": lambda c: c.metric().increment(None),
            "Metric.set:str": lambda c: c.metric("GAUGE").set("x"),
            "Metric.observe:str": lambda c: c.metric("HISTOGRAM").observe("x"),
            "Metric.value:extra_argument": lambda c: c.metric().value(1),
        }

    def option_rows():
        return {
            "PreferredMemory:type_none": lambda c: c.pb.PreferredMemory(None),
            "PreferredMemory:type_str": lambda c: c.pb.PreferredMemory("CPU"),
            "PreferredMemory:device_str": lambda c: c.pb.PreferredMemory(c.pb.TRITONSERVER_MEMORY_CPU, "0"),
            "InferenceTrace:extra_argument": lambda c: c.pb.InferenceTrace(1),
            "InferenceTrace.get_context:extra_argument": lambda c: c.pb.InferenceTrace().get_context(1),
            "ResponseIterator:no_arguments": lambda c: c.pb.ResponseIterator(),
            "ResponseIterator.cancel:extra_argument": lambda c: c.iterator().cancel(1),
        }

    def control_rows():
        return {
            "load_model:name_none": lambda c: c.pb.load_model(None),
            "load_model:config_int": lambda c: c.pb.load_model("no_such_model", config=1),
            "load_model:files_str": lambda c: c.pb.load_model("no_such_model", files="x"),
            "unload_model:name_none": lambda c: c.pb.unload_model(None),
            "unload_model:unload_dependents_str": lambda c: c.pb.unload_model("no_such_model", unload_dependents="x"),
            "unload_model:unload_dependents_none": lambda c: c.pb.unload_model("no_such_model", unload_dependents=None),
            "unload_model:unload_dependents_int": lambda c: c.pb.unload_model("no_such_model", unload_dependents=2),
            "is_model_ready:name_none": lambda c: c.pb.is_model_ready(None),
            "is_model_ready:version_int": lambda c: c.pb.is_model_ready("no_such_model", model_version=1),
        }

    def helper_rows():
        return {
            "get_input_tensor_by_name:request_none": lambda c: c.pb.get_input_tensor_by_name(None, "CASE"),
            "get_output_tensor_by_name:response_none": lambda c: c.pb.get_output_tensor_by_name(None, "T"),
            "get_input_config_by_name:config_none": lambda c: c.pb.get_input_config_by_name(None, "CASE"),
            "get_output_config_by_name:config_none": lambda c: c.pb.get_output_config_by_name(None, "RESULT"),
            "using_decoupled_model_transaction_policy:config_none":
                lambda c: c.pb.using_decoupled_model_transaction_policy(None),
            "triton_to_numpy_type:none": lambda c: c.pb.triton_to_numpy_type(None),
            "numpy_to_triton_type:none": lambda c: c.pb.numpy_to_triton_type(None),
            "triton_string_to_numpy:none": lambda c: c.pb.triton_string_to_numpy(None),
            "serialize_byte_tensor:none": lambda c: c.pb.serialize_byte_tensor(None),
            "deserialize_bytes_tensor:none": lambda c: c.pb.deserialize_bytes_tensor(None),
            "get_model_dir:extra_argument": lambda c: c.pb.get_model_dir(1),
            "new_output_array:none": lambda c: c.pb.new_output_array(None),
            "get_multiplexed_model:none": lambda c: c.pb.get_multiplexed_model(None),
            "async_get_multiplexed_model:extra_argument": lambda c: c.pb.async_get_multiplexed_model("m", 1),
            "get_multiplexed_model_id:extra_argument": lambda c: c.pb.get_multiplexed_model_id(1),
        }

    def config_rows():
        return {
            "ModelConfig:none": lambda c: c.pb.ModelConfig(None),
            "ModelConfig.as_dict:extra_argument": lambda c: c.config().as_dict(1),
            "ModelConfig.set_max_batch_size:str": lambda c: c.config().set_max_batch_size("x"),
            "ModelConfig.set_max_batch_size:none": lambda c: c.config().set_max_batch_size(None),
            "ModelConfig.set_dynamic_batching:extra_argument": lambda c: c.config().set_dynamic_batching(1),
            "ModelConfig.add_input:none": lambda c: c.config().add_input(None),
            "ModelConfig.add_input:no_name": lambda c: c.config().add_input({"data_type": "TYPE_FP32"}),
            "ModelConfig.add_output:none": lambda c: c.config().add_output(None),
            "ModelConfig.add_output:unknown_key": lambda c: c.config().add_output({"name": "Y", "bogus": 1}),
            "ModelConfig.set_model_transaction_policy:none": lambda c: c.config().set_model_transaction_policy(None),
            "ModelConfig.set_model_transaction_policy:unknown_key":
                lambda c: c.config().set_model_transaction_policy({"bogus": True}),
        }

    rows = {}
    for group in (tensor_rows, request_rows, response_rows, sender_rows, error_rows, logger_rows, metric_rows,
                  option_rows, control_rows, helper_rows, config_rows):
        rows.update(group())
    return rows


CASES = _rows()
