"""BLS test driver. The request parameter `mode` selects a scenario; OUT carries data and INFO a
JSON report (errors are reported, not raised). Copies of this model under other names (bls_pong,
...) call each other to build BLS chains.

    chain      call the first model of `chain` (comma-separated) with the rest; OUT = IN + hops
    decoupled  exec(decoupled=True) on `repeat` (COUNT, DELAY_MS); `take`: cancel after that many
    error      one call to `target` (decoupled=`decoupled`), report its error
    timeout    call `slow` (DELAY_MS = `delay_ms`) with the BLS timeout `bls_timeout_us`
    fault      call `faulty` with MODE = `fault`
    die        os._exit while a BLS call is waiting
    probe      call `bls_probe` with every request option; report what it saw
    many       `count` mixed calls (sync, decoupled, cancelled, dropped iterators, errors, big tensors)
    bench      `count` calls to `bls_leaf` with IN; report seconds per call
    inspect    pystub_backend.stub.features.bls.inspect(): this stub's and the backend's BLS bookkeeping
    init       the error initialize got when it tried BLS
    control    load_model / is_model_ready / unload_model of `target`
    stall      exec(decoupled=True) on a fast `repeat`, then read nothing for `seconds`, then all
    call       one call to `target` with IN as `input`, returning its `output` (e.g. an ensemble)
"""

import gc
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _info(response):
    if response.has_error():
        return {"error": response.error().message(), "code": int(response.error().code())}
    return None


def _out(response, name="OUT"):
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy()


def _repeat_request(count, delay_ms=0):
    return pb_utils.InferenceRequest(
        model_name="repeat", requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("COUNT", np.array([count], np.int32)),
                pb_utils.Tensor("DELAY_MS", np.array([delay_ms], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        try:
            _repeat_request(1).exec(decoupled=True)
            self.init_error = None
        except pb_utils.TritonModelException as error:
            self.init_error = str(error)

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            try:
                out, info = getattr(self, "_" + params.get("mode", "chain"))(data, params)
            except Exception as exc:  # report, do not fail: the test reads INFO
                out, info = data, {"exception": f"{type(exc).__name__}: {exc}"}
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.asarray(out, np.float32)),
                pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))]))
        return responses

    def finalize(self):
        try:
            pb_utils.InferenceRequest(model_name="bls_leaf", inputs=[pb_utils.Tensor("IN", np.ones(1, np.float32))],
                                      requested_output_names=["OUT"]).exec()
        except pb_utils.TritonModelException as error:
            print(f"{self.name} finalize: {error}", flush=True)

    # -- scenarios ---------------------------------------------------------------------------------
    def _chain(self, data, params):
        chain = [name for name in params.get("chain", "").split(",") if name]
        if not chain:
            return data + 1, {"path": [self.name]}
        target, rest = chain[0], ",".join(chain[1:])
        leaf = target == "bls_leaf"
        request = pb_utils.InferenceRequest(
            model_name=target, inputs=[pb_utils.Tensor("IN", data)],
            requested_output_names=["OUT"] if leaf else ["OUT", "INFO"], parameters={"mode": "chain", "chain": rest})
        if "decoupled" in target:
            responses = [r for r in request.exec(decoupled=True) if r.has_error() or r.output_tensors()]
            response = responses[0]
        else:
            response = request.exec()
        if response.has_error():
            return data, {"path": [self.name], **_info(response)}
        nested = {"path": [target]} if leaf else json.loads(_out(response, "INFO")[0])
        nested["path"] = [self.name] + nested.get("path", [])
        return _out(response) + 1, nested

    def _decoupled(self, data, params):
        iterator = _repeat_request(int(params.get("count", 3)), int(params.get("delay_ms", 0))).exec(decoupled=True)
        take = params.get("take")
        values, errors, cancelled_at = [], [], None
        started = time.monotonic()
        for response in iterator:
            if response.has_error():
                errors.append([int(response.error().code()), response.error().message()])
            elif response.output_tensors():
                values.append(int(_out(response)[0]))
            if take is not None and len(values) == take and cancelled_at is None:
                cancelled_at = time.monotonic()
                iterator.cancel()
        replay = sum(1 for _ in iterator)
        return np.array(values, np.float32), {"errors": errors, "replayed": replay,
                                              "seconds": time.monotonic() - started,
                                              "after_cancel": None if cancelled_at is None
                                              else time.monotonic() - cancelled_at}

    def _error(self, data, params):
        target = params["target"]
        if target == "repeat":
            request = _repeat_request(1)
        else:
            request = pb_utils.InferenceRequest(model_name=target, inputs=[pb_utils.Tensor("IN", data)],
                                                requested_output_names=["OUT"],
                                                model_version=int(params.get("version", -1)))
        result = request.exec(decoupled=bool(params.get("decoupled", False)))
        response = next(iter(result)) if params.get("decoupled") else result
        return data, _info(response) or {"outputs": [t.name() for t in response.output_tensors()]}

    def _timeout(self, data, params):
        request = pb_utils.InferenceRequest(
            model_name="slow", inputs=[pb_utils.Tensor("DELAY_MS", np.array([params["delay_ms"]], np.int32))],
            requested_output_names=["OUTPUT0"], timeout=int(params.get("bls_timeout_us", 0)))
        started = time.monotonic()
        response = request.exec()
        return data, {**(_info(response) or {}), "seconds": time.monotonic() - started}

    def _fault(self, data, params):
        request = pb_utils.InferenceRequest(
            model_name="faulty", inputs=[pb_utils.Tensor("MODE", np.array([params["fault"]], np.int32))],
            requested_output_names=["OUTPUT0"])
        started = time.monotonic()
        response = request.exec()
        info = {**(_info(response) or {}), "seconds": time.monotonic() - started}
        if "then" in params:  # at once again: the target is restarting
            again = pb_utils.InferenceRequest(
                model_name="faulty", inputs=[pb_utils.Tensor("MODE", np.array([params["then"]], np.int32))],
                requested_output_names=["OUTPUT0"]).exec()
            info["then"] = _info(again)
        return data, info

    def _die(self, data, params):
        threading.Timer(0.3, lambda: os._exit(1)).start()
        pb_utils.InferenceRequest(
            model_name="slow", inputs=[pb_utils.Tensor("DELAY_MS", np.array([3000], np.int32))],
            requested_output_names=["OUTPUT0"]).exec()
        return data, {"error": "still alive"}

    def _probe(self, data, params):
        request = pb_utils.InferenceRequest(
            model_name="bls_probe", inputs=[pb_utils.Tensor("IN", data)], requested_output_names=["REQUEST", "OUT"],
            request_id="bls-7", correlation_id=params.get("correlation_id", 42), model_version=1,
            flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, timeout=5_000_000,
            preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
            parameters={"greeting": "hi", "n": 3, "flag": True})
        response = request.exec()
        if response.has_error():
            return data, _info(response)
        return _out(response), {"seen": json.loads(_out(response, "REQUEST")[0]),
                                "response_parameters": json.loads(response.parameters()),
                                "outputs": sorted(t.name() for t in response.output_tensors())}

    def _many(self, data, params):
        count, calls, bad = int(params.get("count", 100)), 0, []
        big = np.ones(4096, np.float32)
        for index in range(count):
            kinds = [int(k) for k in params.get("kinds", "012345")]
            kind = kinds[index % len(kinds)]
            if kind == 0:
                response = pb_utils.InferenceRequest(model_name="bls_leaf", inputs=[pb_utils.Tensor("IN", data)],
                                                     requested_output_names=["OUT"]).exec()
                ok = not response.has_error() and np.array_equal(_out(response), data + 1)
            elif kind == 1:
                values = [int(_out(r)[0]) for r in _repeat_request(3).exec(decoupled=True) if r.output_tensors()]
                ok = values == [0, 1, 2]
            elif kind == 2:  # cancelled mid-stream
                iterator = _repeat_request(1000, 1).exec(decoupled=True)
                next(iterator)
                iterator.cancel()
                ok = all(True for _ in iterator)
            elif kind == 3:  # dropped after one response: the call is cancelled by the collector
                iterator = _repeat_request(1000, 1).exec(decoupled=True)
                ok = next(iterator).output_tensors() != []
                del iterator
            elif kind == 4:  # an error answer
                response = pb_utils.InferenceRequest(model_name="no_such_model", inputs=[pb_utils.Tensor("IN", data)],
                                                     requested_output_names=["OUT"]).exec()
                ok = response.has_error()
            else:  # a bigger tensor, kept for a while then dropped
                response = pb_utils.InferenceRequest(model_name="bls_leaf", inputs=[pb_utils.Tensor("IN", big)],
                                                     requested_output_names=["OUT"]).exec()
                ok = not response.has_error() and float(_out(response)[0]) == 2.0
            calls += 1
            if not ok:
                bad.append(index)
        gc.collect()
        return data, {"calls": calls, "bad": bad[:10]}

    def _bench(self, data, params):
        count = int(params.get("count", 100))
        request = pb_utils.InferenceRequest(model_name="bls_leaf", inputs=[pb_utils.Tensor("IN", data)],
                                            requested_output_names=["OUT"])
        request.exec()  # warm up
        started = time.perf_counter()
        for _ in range(count):
            response = request.exec()
            if response.has_error():
                return data[:1], _info(response)
            del response
        return data[:1], {"per_call": (time.perf_counter() - started) / count}

    def _inspect(self, data, params):
        from pystub_backend.stub.features import bls
        gc.collect()
        return data, bls.inspect()

    def _init(self, data, params):
        return data, {"error": self.init_error}

    def _control(self, data, params):
        target, steps = params["target"], []
        for step in params["steps"].split(","):
            try:
                if step == "load":
                    pb_utils.load_model(target)
                    steps.append("loaded")
                elif step == "unload":
                    pb_utils.unload_model(target)
                    steps.append("unloaded")
                elif step == "ready":
                    steps.append(pb_utils.is_model_ready(target))
                elif step == "load_config":
                    pb_utils.load_model(target, config=params["config"])
                    steps.append("loaded")
            except pb_utils.TritonModelException as error:
                steps.append(f"error: {error}")
        return data, {"steps": steps}

    def _call(self, data, params):
        request = pb_utils.InferenceRequest(model_name=params["target"], inputs=[pb_utils.Tensor(params["input"], data)],
                                            requested_output_names=[params["output"]])
        response = request.exec(decoupled=bool(params.get("decoupled", False)))
        if params.get("decoupled"):
            responses = list(response)
            errors = [_info(r) for r in responses if r.has_error()]
            outs = [_out(r, params["output"]) for r in responses if r.output_tensors()]
            return (np.concatenate(outs) if outs else data[:0]), {"responses": len(responses), "errors": errors}
        if response.has_error():
            return data, _info(response)
        return _out(response, params["output"]), {}

    def _stall(self, data, params):
        iterator = _repeat_request(int(params.get("count", 1000))).exec(decoupled=True)
        time.sleep(float(params["seconds"]))
        values, errors = 0, []
        for response in iterator:
            if response.has_error():
                errors.append(response.error().message())
            elif response.output_tensors():
                values += 1
        return data, {"values": values, "errors": errors}
