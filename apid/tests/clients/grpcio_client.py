"""A gRPC C-core client (grpcio) calling apid over mutual TLS with a talosconfig's credentials.

gRPC's C-core (Python, C++, Ruby) does its TLS with BoringSSL, which does not accept Ed25519
handshake signatures (grpc/grpc#24252): apid must serve with an ECDSA key, although its
certificate is signed by the (Ed25519) OS CA. The client key of a talosconfig is Ed25519, in
PKCS#8 under Go's label `ED25519 PRIVATE KEY`; grpcio takes the same body under PKCS#8's own
label, `PRIVATE KEY` (what README.md, "Other gRPC clients", says).

In maintenance (no configuration yet) apid serves a certificate of its own, which a client pins
by its fingerprint (upstream's `--cert-fingerprint`: the base64 SHA-256 of its public key, DER
SubjectPublicKeyInfo, as apid logs it): the client reads the certificate off a first
handshake, checks the fingerprint, and then trusts that certificate alone (BoringSSL takes a
trusted leaf as the whole chain), without a client certificate.

Usage: grpcio_client.py ADDRESS TAG admin|reader TALOSCONFIG, or grpcio_client.py ADDRESS TAG
maintenance FINGERPRINT; TAG is the version tag apid says. Exit 0 when Version and the COSI
List calls answer as the role allows (maintenance: a reader's). The protobuf messages are
encoded and decoded by hand, so that nothing but grpcio and PyYAML is needed.
"""

import base64
import hashlib
import ssl
import sys

import grpc
import yaml


# The snippet of README.md ("Other gRPC clients"), as it is there.
def talos_credentials(path):
    """grpcio's credentials of the current context of the talosconfig at `path`."""
    with open(path) as f:
        config = yaml.safe_load(f)
    context = config["contexts"][config["context"]]
    ca, crt, key = (base64.b64decode(context[k]) for k in ("ca", "crt", "key"))
    # Go's label of a PKCS#8 Ed25519 key; BoringSSL reads the same body as `PRIVATE KEY`.
    key = key.replace(b"ED25519 PRIVATE KEY", b"PRIVATE KEY")
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=crt
    )


# The name of the maintenance certificate (its DNS SAN; apid's MAINTENANCE_SERVER_NAME).
MAINTENANCE_NAME = "talos-rs-maintenance"


def der_element(data, i):
    """The DER element at `i`: (start of its content, its end)."""
    n = data[i + 1]
    i += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(data[i : i + k], "big")
        i += k
    return i, i + n


def spki(der):
    """The DER SubjectPublicKeyInfo of a DER certificate."""
    tbs, _ = der_element(der, 0)
    i, _ = der_element(der, tbs)
    if der[i] == 0xA0:  # [0] version
        i = der_element(der, i)[1]
    for _ in range(5):  # serial, signature, issuer, validity, subject
        i = der_element(der, i)[1]
    return der[i : der_element(der, i)[1]]


def pinned_credentials(address, fingerprint):
    """grpcio's credentials trusting only the certificate at `address` of `fingerprint`."""
    host, port = address.rsplit(":", 1)
    pem = ssl.get_server_certificate((host, int(port)))
    seen = base64.b64encode(
        hashlib.sha256(spki(ssl.PEM_cert_to_DER_cert(pem))).digest()
    ).decode()
    if seen != fingerprint:
        raise SystemExit(f"the server's fingerprint is {seen}, not {fingerprint}")
    return grpc.ssl_channel_credentials(root_certificates=pem.encode())


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(number, value):
    """A length-delimited field (string, bytes, message)."""
    data = value.encode() if isinstance(value, str) else value
    return varint((number << 3) | 2) + varint(len(data)) + data


def fields(data):
    """The fields of a message: (number, value), value an int or bytes."""
    i = 0

    def read_varint():
        nonlocal i
        n, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(data):
        key = read_varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, read_varint()
        elif wire == 2:
            n = read_varint()
            yield number, data[i : i + n]
            i += n
        elif wire == 1:
            yield number, data[i : i + 8]
            i += 8
        elif wire == 5:
            yield number, data[i : i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wire}")


def first(data, number):
    return next((v for n, v in fields(data) if n == number), b"")


def list_ids(channel, namespace, type_):
    """cosi.resource.State/List: the IDs of the resources listed."""
    call = channel.unary_stream(
        "/cosi.resource.State/List",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    ids = []
    for reply in call(field(1, namespace) + field(2, type_), timeout=10):
        # ListResponse.resource (1) -> Resource.metadata (1) -> Metadata.id (3)
        metadata = first(first(reply, 1), 1)
        ids.append(first(metadata, 3).decode())
    return ids


def main():
    address, tag, role, arg = sys.argv[1:5]
    if role == "maintenance":
        channel = grpc.secure_channel(
            address,
            pinned_credentials(address, arg),
            options=[("grpc.ssl_target_name_override", MAINTENANCE_NAME)],
        )
    else:
        channel = grpc.secure_channel(address, talos_credentials(arg))

    # machine.MachineService/Version, google.protobuf.Empty in:
    # VersionResponse.messages (1) -> Version.version (2) -> VersionInfo.tag (1).
    version = channel.unary_unary("/machine.MachineService/Version")
    try:
        reply = version(b"", timeout=10)
    except grpc.RpcError as e:
        print("Version:", e.code(), e.details())
        return 1
    got = first(first(first(reply, 1), 2), 1).decode()
    if got != tag:
        print(f"Version: tag {got!r}, expected {tag!r}")
        return 1

    addresses = list_ids(channel, "network", "NodeAddresses.net.talos.dev")
    if not addresses:
        print("List of NodeAddresses: nothing listed")
        return 1
    definitions = list_ids(channel, "meta", "ResourceDefinitions.meta.cosi.dev")
    if "nodeaddresses.net.talos.dev" not in definitions:
        print("List of ResourceDefinitions: no nodeaddresses.net.talos.dev in", definitions)
        return 1

    # A sensitive type: an admin's, not a reader's.
    try:
        roots = list_ids(channel, "secrets", "OSRootSecrets.secrets.talos.dev")
        if role != "admin":
            print("a reader listed OSRootSecrets:", roots)
            return 1
        if roots != ["os"]:
            print("List of OSRootSecrets:", roots)
            return 1
    except grpc.RpcError as e:
        if role == "admin" or e.code() != grpc.StatusCode.PERMISSION_DENIED:
            print(f"List of OSRootSecrets as {role}:", e.code(), e.details())
            return 1
    print(f"ok: {role}: {tag}, addresses {addresses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
