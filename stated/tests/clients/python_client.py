"""A gRPC C-core client (grpcio) talking to stated over its Unix socket.

C-core (Python, C++, Ruby) sends the socket path, %-encoded, as the HTTP/2 `:authority` of a
Unix-socket channel; an HTTP/2 server that insists on an RFC authority resets those streams
(PROTOCOL_ERROR). Usage: python_client.py SOCKET. Exit 0 when stated answered every call with
the status the COSI matrix says; the protobuf messages are encoded by hand (three string
fields), so that nothing but grpcio is needed.
"""

import sys

import grpc


def field(number, value):
    data = value.encode()
    out = bytes([(number << 3) | 2])
    n = len(data)
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            out += bytes([b])
            break
    return out + data


def main():
    socket = sys.argv[1]
    channel = grpc.insecure_channel("unix:" + socket)
    get = channel.unary_unary(
        "/cosi.resource.State/Get",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    # A resource that exists: the reply carries it.
    reply = get(
        field(1, "default") + field(2, "Things.test.talos.dev") + field(3, "hello"),
        timeout=10,
    )
    if b"hello" not in reply:
        print("reply does not hold the resource:", reply)
        return 1
    # One that does not: NOT_FOUND, not a reset stream.
    try:
        get(
            field(1, "default") + field(2, "Things.test.talos.dev") + field(3, "nope"),
            timeout=10,
        )
        print("expected NOT_FOUND")
        return 1
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            print("expected NOT_FOUND, got", e.code(), e.details())
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
