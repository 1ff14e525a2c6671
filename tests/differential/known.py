# ruff: noqa: E501  (one difference per line: the reasons are data, not code)
"""Every difference between Triton 2.51 and pystub that the tier found, by test id.

docs/triton-differences.md explains each and names where the behaviour lives in pystub_backend.
The tests assert agreement; conftest.py marks these ids xfail(strict=True) with the reason, so a
fix shows as XPASS(strict) and its entry must then be removed here and in the doc.
"""

KNOWN: dict[str, str] = {
    "test_endpoints.py::test_grpc_admin[shm_register_missing_key]":
        "Triton answers {\"error\": \"Unable to open shared memory region: '/no_such_shm_key_differential'\", \"status\": \"StatusCode.INTERNAL\"}; pystub answers {\"error\": \"Unable to open shared memory region: '/no_such_shm_key_differential': No such file or directory\", \"status\": \"StatusCode.INVALID_ARGUMENT\"}",
    "test_endpoints.py::test_grpc_admin[statistics_unknown_model]":
        "Triton answers {\"error\": \"requested model 'no_such_model' is not available\", \"status\": \"StatusCode.INVALID_ARGUMENT\"}; pystub answers {\"error\": \"Request for unknown model: 'no_such_model' is not found\", \"status\": \"StatusCode.NOT_FOUND\"}",
    "test_endpoints.py::test_grpc_admin[statistics_unloaded_model]":
        "Triton answers {\"error\": \"requested model 'loadable' is not available\", \"status\": \"StatusCode.INVALID_ARGUMENT\"}; pystub answers {\"error\": \"Request for unknown model: 'loadable' is not found\", \"status\": \"StatusCode.NOT_FOUND\"}",
    "test_endpoints.py::test_logging_update[not_json]":
        "Triton answers [500, {\"error\": \"failed to parse the request JSON buffer: Missing a name for object member. at 1\"}]; pystub answers [400, {\"error\": \"failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)\"}]",
    "test_endpoints.py::test_logging_update[body3]":
        "Triton answers [500, {\"error\": \"attempt to access JSON non-unsigned-integer as unsigned-integer\"}]; pystub answers [400, {\"error\": \"log setting 'log_verbose_level' must be an integer >= 0, got -1\"}]",
    "test_endpoints.py::test_logging_update[body4]":
        "Triton answers [500, {\"error\": \"attempt to access JSON non-boolean as boolean\"}]; pystub answers [400, {\"error\": \"log setting 'log_info' must be a boolean, got 'yes'\"}]",
    "test_endpoints.py::test_logging_update[body5]":
        "Triton answers [503, {\"error\": \"invalid argument for --log_format, got: xml\"}]; pystub answers [400, {\"error\": \"log setting 'log_format' must be 'default' or 'ISO8601', got 'xml'\"}]",
    "test_endpoints.py::test_metric_families_of_triton_in_pystub":
        "Triton exports nv_pinned_memory_pool_total_bytes and nv_pinned_memory_pool_used_bytes (0 without GPU); pystub has neither",
    "test_endpoints.py::test_model_config_grpc[repeat]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'repeat', pystub 'repeat_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_grpc[seq_acc]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'seq_acc', pystub 'seq_acc_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[bf16_echo]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'bf16_echo', pystub 'bf16_echo_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[bls_caller]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'bls_caller', pystub 'bls_caller_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[bls_stream]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'bls_stream', pystub 'bls_stream_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[bytes_echo]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'bytes_echo', pystub 'bytes_echo_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[controller]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'controller', pystub 'controller_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[counter]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'counter', pystub 'counter_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[gen]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'gen', pystub 'gen_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[gen_stream]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'gen_stream', pystub 'gen_stream_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[params_echo]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'params_echo', pystub 'params_echo_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[raiser]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'raiser', pystub 'raiser_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[repeat]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'repeat', pystub 'repeat_0' (everything else in the config is equal)",
    "test_endpoints.py::test_model_config_http[seq_acc]":
        "instance_group[0].name of a model whose config.pbtxt has no instance_group: Triton 'seq_acc', pystub 'seq_acc_0' (everything else in the config is equal)",
    "test_endpoints.py::test_repository_index[None]":
        "index entries of loaded models: Triton has {name, version, state}, pystub adds \"reason\": \"\" (Triton omits an empty reason)",
    "test_endpoints.py::test_repository_index[body1]":
        "index entries of loaded models: Triton has {name, version, state}, pystub adds \"reason\": \"\" (Triton omits an empty reason)",
    "test_endpoints.py::test_repository_index[body2]":
        "index entries of loaded models: Triton has {name, version, state}, pystub adds \"reason\": \"\" (Triton omits an empty reason)",
    "test_endpoints.py::test_repository_index[body3]":
        "index entries of loaded models: Triton has {name, version, state}, pystub adds \"reason\": \"\" (Triton omits an empty reason)",
    "test_endpoints.py::test_repository_index_bad_json":
        "Triton answers 500; pystub answers 400",
    "test_endpoints.py::test_server_extensions":
        "extensions: Triton also lists classification, cuda_shared_memory, schedule_policy, sequence; pystub lists only binary_tensor_data, logging, model_configuration, model_repository, model_repository(unload_dependents), parameters, statistics, system_shared_memory, trace",
    "test_endpoints.py::test_statistics_status[/v2/models/add_sub/versions/7/stats]":
        "Triton answers [400, \"requested model version is not available for model 'add_sub'\"]; pystub answers [404, \"Request for unknown model: 'add_sub' version 7 is not found\"]",
    "test_endpoints.py::test_statistics_status[/v2/models/loadable/stats]":
        "Triton answers [400, \"requested model 'loadable' is not available\"]; pystub answers [404, \"Request for unknown model: 'loadable' is not found\"]",
    "test_endpoints.py::test_statistics_status[/v2/models/no_such_model/stats]":
        "Triton answers [400, \"requested model 'no_such_model' is not available\"]; pystub answers [404, \"Request for unknown model: 'no_such_model' is not found\"]",
    "test_features.py::test_bls[loadable]":
        "Triton answers {\"error\": \"inner: Model loadable - Error when running inference: Failed for execute the inference request. Model 'loadable' is not ready.\", \"status\": \"StatusCode.INTERNAL\"}; pystub answers {\"error\": \"inner: Model loadable - Error when running inference: Request for unknown model: 'loadable' is not found\", \"status\": \"StatusCode.INTERNAL\"}",
    "test_features.py::test_bls[no_such_model]":
        "Triton answers {\"error\": \"inner: Model no_such_model - Error when running inference: Failed for execute the inference request. Model 'no_such_model' is not ready.\", \"status\": \"StatusCode.INTERNAL\"}; pystub answers {\"error\": \"inner: Model no_such_model - Error when running inference: Request for unknown model: 'no_such_model' is not found\", \"status\": \"StatusCode.INTERNAL\"}",
    "test_features.py::test_custom_metrics":
        "custom metric sample values: Triton prints whole numbers without a fraction ('diff_counter_total{...} 5'), pystub prints '5.0'",
    "test_features.py::test_generate[gen_bad_json]":
        "Triton answers [500, {\"error\": \"failed to parse the request JSON buffer: Missing a name for object member. at 1\"}]; pystub answers [400, {\"error\": \"failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)\"}]",
    "test_features.py::test_generate[gen_number_input]":
        "Triton answers [500, {\"error\": \"Unable to parse JSON bytes array: attempt to access JSON non-string as string\"}]; pystub answers [400, {\"error\": \"'data' of input 'text_input' must contain only strings\"}]",
    "test_features.py::test_generate[gen_on_decoupled]":
        "Triton answers [200, {\"error\": \"generate expects model to produce exactly 1 response, use generate stream for model that generates various number of responses\"}]; pystub answers [501, {\"error\": \"generate expects exactly one response from the model, got 2; use generate_stream\"}]",
    "test_features.py::test_model_control_from_model[load_missing]":
        "Triton answers [{\"error\": \"Failed to process the request(s) for model 'controller_0', message: TritonModelException: Failed to load model: Failed to process the request for model 'controller_0', message: failed to load 'never_in_repository', failed to poll from model repository\\n\\nAt:\\n  /tmp/differential-0ehbtap4/triton/models/controller/1/model.py(14): execute\\n\", \"status\": \"StatusCode.INTERNAL\"}]; pystub answers [{\"error\": \"Failed to process the request(s) for model 'controller_0_0', message: TritonModelException: Failed to load model: load failed for model 'never_in_repository': failed to poll from model repository\", \"status\": \"StatusCode.INTERNAL\"}]",
    "test_features.py::test_model_errors[model_exception-grpc]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'; Triton appends the Python traceback ('\\n\\nAt:\\n  <path>/model.py(<line>): execute\\n'), pystub does not",
    "test_features.py::test_model_errors[model_exception-http]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'; Triton appends the Python traceback ('\\n\\nAt:\\n  <path>/model.py(<line>): execute\\n'), pystub does not",
    "test_features.py::test_model_errors[no_responses-grpc]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'",
    "test_features.py::test_model_errors[no_responses-http]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'",
    "test_features.py::test_model_errors[raises_value_error-grpc]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'; Triton appends the Python traceback ('\\n\\nAt:\\n  <path>/model.py(<line>): execute\\n'), pystub does not",
    "test_features.py::test_model_errors[raises_value_error-http]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'; Triton appends the Python traceback ('\\n\\nAt:\\n  <path>/model.py(<line>): execute\\n'), pystub does not",
    "test_features.py::test_model_errors[returns_string-grpc]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'",
    "test_features.py::test_model_errors[returns_string-http]":
        "instance name in the error text: Triton 'raiser_0' (group '<model>' + '_0'), pystub 'raiser_0_0'",
    "test_features.py::test_repository_errors[bad_config_override]":
        "Triton answers [500, {\"error\": \"failed to load 'loadable', failed to poll from model repository\"}]; pystub answers [400, {\"error\": \"load failed for model 'loadable': failed to parse model configuration JSON: Failed to load JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1).\"}]",
    "test_features.py::test_repository_errors[bad_json]":
        "Triton answers [500, {\"error\": \"failed to parse the request JSON buffer: Missing a name for object member. at 1\"}]; pystub answers [400, {\"error\": \"failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)\"}]",
    "test_features.py::test_repository_errors[init_fails]":
        "Triton answers [400, {\"error\": \"load failed for model 'init_fails': version 1 is at UNAVAILABLE state: Internal: RuntimeError: cannot start\"}]; pystub answers [400, {\"error\": \"load failed for model 'init_fails': version 1 is at UNAVAILABLE state: Internal: RuntimeError: cannot start\\nTraceback (most recent call last):\\n  File \\\"/work/wt/differential/pystub_backend/stub/stub.py\\\", line 212, in _init\\n    initialize(args)\\n  File \\\"/tmp/differential-0ehbtap4/pystub/models/init_fails/1/model.py\\\", line 6, in initialize\\n    raise RuntimeError(\\\"cannot start\\\")\\nRuntimeError: cannot start\\n;\"}]",
    "test_features.py::test_reserved_parameters[binary_data_output]":
        "Triton answers [500, {\"error\": \"Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean\"}]; pystub answers [400, {\"error\": \"parameter 'binary_data_output' must be a boolean\"}]",
    "test_features.py::test_system_shared_memory_http[register_bad_json]":
        "Triton answers [500, {\"error\": \"failed to parse the request JSON buffer: Missing a name for object member. at 1\"}]; pystub answers [400, {\"error\": \"failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)\"}]",
    "test_features.py::test_system_shared_memory_http[register_missing_key]":
        "Triton answers [500, {\"error\": \"Unable to open shared memory region: '/no_such_shm_key_differential'\"}]; pystub answers [400, {\"error\": \"Unable to open shared memory region: '/no_such_shm_key_differential': No such file or directory\"}]",
    "test_infer.py::test_http_binary_raw[header_length_too_large]":
        "Triton answers [400, {\"error\": \"inference header size should be in range (0, 232), got: 100000\"}]; pystub answers [400, {\"error\": \"Inference-Header-Content-Length 100000 exceeds the request body size of 232 bytes\"}]",
    "test_infer.py::test_http_binary_raw[header_length_too_small]":
        "Triton answers [500, {\"error\": \"failed to parse the request JSON buffer: Missing a closing quotation mark in string. at 5\"}]; pystub answers [400, {\"error\": \"failed to parse the request JSON buffer: Unterminated string starting at: line 1 column 2 (char 1)\"}]",
    "test_infer.py::test_http_binary_raw[missing_blob]":
        "Triton answers [400, {\"error\": \"unexpected size for input 'INPUT1', expecting 16 additional bytes for model 'add_sub'\"}]; pystub answers [400, {\"error\": \"unexpected size 16 for binary input 'INPUT1': only 0 bytes of binary data remain in the request body\"}]",
    "test_infer.py::test_http_binary_raw[size_mismatch]":
        "Triton answers [400, {\"error\": \"unexpected additional input data for model 'add_sub'\"}]; pystub answers [400, {\"error\": \"unexpected additional input data: 4 bytes after the last binary input\"}]",
    "test_infer.py::test_http_binary_raw[trailing_bytes]":
        "Triton answers [400, {\"error\": \"unexpected additional input data for model 'add_sub'\"}]; pystub answers [400, {\"error\": \"unexpected additional input data: 2 bytes after the last binary input\"}]",
    "test_infer.py::test_http_json[bad_json]":
        "Triton answers [500, {\"error\": \"failed to parse the request JSON buffer: Missing a name for object member. at 1\"}]; pystub answers [400, {\"error\": \"failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)\"}]",
    "test_infer.py::test_http_json[bf16_json]":
        "Triton answers [400, {\"error\": \"receiving BF16 data via JSON is not supported. Please use the binary data format for input INPUT0\"}]; pystub answers [400, {\"error\": \"input 'INPUT0' has datatype BF16, which cannot be sent as JSON data; send it as binary data\"}]",
    "test_infer.py::test_http_json[body_is_array]":
        "Triton answers [500, {\"error\": \"Unable to parse 'inputs': attempt to access non-existing object member 'inputs'\"}]; pystub answers [400, {\"error\": \"the inference request must be a JSON object\"}]",
    "test_infer.py::test_http_json[bytes_json_number]":
        "Triton answers [500, {\"error\": \"Unable to parse JSON bytes array: attempt to access JSON non-string as string\"}]; pystub answers [400, {\"error\": \"'data' of input 'INPUT0' must contain only strings\"}]",
    "test_infer.py::test_http_json[data_count_mismatch]":
        "Triton answers [500, {\"error\": \"Unable to parse 'data': Shape does not match true shape of 'data' field\"}]; pystub answers [400, {\"error\": \"unexpected number of elements in 'data' of input 'INPUT0': shape [4] needs 4, got 3\"}]",
    "test_infer.py::test_http_json[empty_object]":
        "Triton answers [500, {\"error\": \"Unable to parse 'inputs': attempt to access non-existing object member 'inputs'\"}]; pystub answers [400, {\"error\": \"[request id: <id_unknown>] expected 2 inputs but got 0 inputs for model 'add_sub'. Got input(s) [], but missing required input(s) ['INPUT0','INPUT1']. Please provide all required input(s).\"}]",
    "test_infer.py::test_http_json[extra_input]":
        "Triton answers [400, {\"error\": \"[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ['INPUT2','INPUT1','INPUT0'], but missing required input(s) ]. Please provide all required input(s).\"}]; pystub answers [400, {\"error\": \"[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ['INPUT0','INPUT1','INPUT2'], but missing required input(s) ]. Please provide all required input(s).\"}]",
    "test_infer.py::test_http_json[input_without_datatype]":
        "Triton answers [500, {\"error\": \"Unable to parse 'datatype': attempt to access non-existing object member 'datatype'\"}]; pystub answers [400, {\"error\": \"input 'INPUT0' has unknown datatype 'None'\"}]",
    "test_infer.py::test_http_json[input_without_shape]":
        "Triton answers [500, {\"error\": \"Unable to parse 'shape': attempt to access non-existing object member 'shape'\"}]; pystub answers [400, {\"error\": \"'shape' of input 'INPUT0' must be an array of non-negative int64 integers\"}]",
    "test_infer.py::test_http_json[inputs_not_list]":
        "Triton answers [500, {\"error\": \"Unable to parse 'inputs': attempt to access JSON non-array as array\"}]; pystub answers [400, {\"error\": \"'inputs' of the inference request must be an array of objects\"}]",
    "test_infer.py::test_http_json[int32_out_of_range]":
        "Triton answers [200, {\"model_name\": \"raiser\", \"model_version\": \"1\", \"outputs\": [{\"data\": [0], \"datatype\": \"INT32\", \"name\": \"OUTPUT0\", \"shape\": [1]}]}]; pystub answers [400, {\"error\": \"'data' of input 'MODE' holds a value outside the range of INT32 [-2147483648, 2147483647]\"}]",
    "test_infer.py::test_http_json[negative_shape]":
        "Triton answers [500, {\"error\": \"Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer\"}]; pystub answers [400, {\"error\": \"'shape' of input 'INPUT0' must be an array of non-negative int64 integers\"}]",
    "test_infer.py::test_http_json[string_in_fp32]":
        "Triton answers [500, {\"error\": \"Unable to parse 'data': attempt to access JSON non-number as double\"}]; pystub answers [400, {\"error\": \"'data' of input 'INPUT0' must contain only numbers\"}]",
    "test_infer.py::test_http_json[unknown_datatype]":
        "Triton answers [400, {\"error\": \"invalid datatype for input INPUT0\"}]; pystub answers [400, {\"error\": \"input 'INPUT0' has unknown datatype 'FP128'\"}]",
}
