#!/usr/bin/python3
"""A Python gRPC client against the real moe-worker.

Generates Python stubs from proto/ with grpc_tools, makes a tiny model with
`moectl make-model`, starts moe-worker on a Unix socket and a TCP port, and
streams Generate over both: the same greedy and seeded tokens, one message
per token, the summary on the last, INVALID_ARGUMENT for a bad request, and
a clean exit 0 on SIGTERM.

usage: python_client_test.py --worker BIN --moectl BIN --proto-dir DIR --out DIR
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None


def generate_stubs(proto_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    # The system protoc (the one the C++ build uses, matching python3-protobuf)
    # with gRPC's Python plugin: Debian's grpc_tools bundles protoc 3.5, which
    # refuses proto3 `optional` (GenerateRequest.seed).
    plugin = shutil.which("grpc_python_plugin")
    if shutil.which("protoc") and plugin:
        protoc = ["protoc", "--plugin=protoc-gen-grpc_python=" + plugin,
                  "--python_out", out_dir, "--grpc_python_out", out_dir]
    else:
        protoc = [sys.executable, "-m", "grpc_tools.protoc", "--python_out",
                  out_dir, "--grpc_python_out", out_dir]
    subprocess.run(protoc + ["-I", proto_dir, "moe/v1/inference.proto"], check=True)
    # Top-level health_pb2: a grpc/ folder here would shadow grpcio itself.
    subprocess.run(protoc + ["-I", os.path.join(proto_dir, "grpc/health/v1"),
                             "health.proto"], check=True)
    sys.path.insert(0, out_dir)


class WorkerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        import grpc
        import health_pb2
        import health_pb2_grpc
        from moe.v1 import inference_pb2, inference_pb2_grpc
        cls.grpc, cls.pb, cls.pb_grpc = grpc, inference_pb2, inference_pb2_grpc
        cls.tmp = tempfile.mkdtemp(prefix="moe_pyclient.")
        model = os.path.join(cls.tmp, "model")
        subprocess.run([ARGS.moectl, "make-model", "--preset", "tiny",
                        "--out", model, "--seed", "11"], check=True,
                       stdout=subprocess.DEVNULL)
        cls.sock = "unix:" + os.path.join(cls.tmp, "w.sock")
        ports = os.path.join(cls.tmp, "ports.json")
        cls.log = open(os.path.join(cls.tmp, "worker.log"), "w")
        cls.proc = subprocess.Popen(
            [ARGS.worker, "--model", model, "--backend", "cpu",
             "--listen", cls.sock, "--listen", "127.0.0.1:0",
             "--metrics-addr", "", "--port-file", ports],
            stdout=cls.log, stderr=subprocess.STDOUT)
        # Poll health until SERVING (the port file is written before).
        channel = grpc.insecure_channel(cls.sock)
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 60
        while True:
            if cls.proc.poll() is not None:
                raise RuntimeError("moe-worker exited: %s" % cls.read_log())
            if time.monotonic() > deadline:
                raise RuntimeError("moe-worker never became SERVING")
            try:
                grpc.channel_ready_future(channel).result(timeout=0.5)
                resp = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except (grpc.FutureTimeoutError, grpc.RpcError):
                continue
        channel.close()
        with open(ports) as f:
            cls.tcp = "127.0.0.1:%d" % json.load(f)["grpc_port"]

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()
        cls.log.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def read_log(cls):
        with open(os.path.join(cls.tmp, "worker.log")) as f:
            return f.read()

    def stream(self, target, **fields):
        with self.grpc.insecure_channel(target) as channel:
            stub = self.pb_grpc.InferenceStub(channel)
            return list(stub.Generate(self.pb.GenerateRequest(**fields),
                                      timeout=60))

    def test_greedy_stream_over_unix_and_tcp(self):
        req = dict(prompt_token_ids=[3, 14, 15, 92], max_new_tokens=12,
                   ignore_eos=True, top_logprobs=2)
        over_unix = self.stream(self.sock, **req)
        over_tcp = self.stream(self.tcp, **req)
        self.assertEqual(len(over_unix), 12)
        self.assertEqual([r.token_id for r in over_unix],
                         [r.token_id for r in over_tcp])
        for r in over_unix[:-1]:
            self.assertEqual(r.finish_reason, "")
            self.assertFalse(r.HasField("usage"))
            self.assertEqual(len(r.top_logprobs), 2)
            self.assertEqual(r.top_logprobs[0].token_id, r.token_id)
            self.assertLessEqual(r.logprob, 0.0)
        last = over_unix[-1]
        self.assertEqual(last.finish_reason, "length")
        self.assertEqual(last.usage.prompt_tokens, 4)
        self.assertEqual(last.usage.generated_tokens, 12)
        self.assertGreater(last.usage.time_to_first_token_seconds, 0)

    def test_seeded_text_prompt_is_reproducible(self):
        req = dict(prompt="hello cache", max_new_tokens=10, temperature=0.9,
                   top_p=0.95, seed=42, ignore_eos=True)
        a = self.stream(self.tcp, **req)
        b = self.stream(self.sock, **req)
        self.assertEqual([r.token_id for r in a], [r.token_id for r in b])
        self.assertEqual("".join(r.text for r in a),
                         "".join(r.text for r in b))

    def test_bad_request_is_invalid_argument(self):
        with self.assertRaises(self.grpc.RpcError) as ctx:
            self.stream(self.tcp, prompt_token_ids=[1], max_new_tokens=0)
        self.assertEqual(ctx.exception.code(),
                         self.grpc.StatusCode.INVALID_ARGUMENT)

    def test_zz_sigterm_exits_zero(self):  # runs last (alphabetical order)
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(timeout=60), 0, self.read_log())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    parser.add_argument("--moectl", required=True)
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--out", required=True)
    ARGS, rest = parser.parse_known_args()
    generate_stubs(ARGS.proto_dir, ARGS.out)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
