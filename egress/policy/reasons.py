"""Every reason code the proxy gives (SPEC §3, §7, §8): in the `X-Egress-Denied` /
`X-Egress-Error` headers and JSON bodies, the audit log and metric labels. Other tools
match on these strings, so they are defined here once and nowhere else.
"""

# Decisions about a destination (egress/policy/decisions.py).
NOT_ALLOWLISTED = "not_allowlisted"
LOOPBACK = "loopback"
FORBIDDEN_ADDRESS = "forbidden_address"
RESOLVE_FAILED = "resolve_failed"
HOST_MISMATCH = "host_mismatch"
PLAINTEXT_CREDENTIALS = "plaintext_credentials"
# TRACE (and IIS's TRACK) ask the server to echo the request it received: with a
# transform, the echo carries the injected credential back to the sandbox.
TRACE_CREDENTIALS = "trace_credentials"
PROXY_SELF = "proxy_self"
NO_SNI = "no_sni"
INTERNAL_ERROR = "internal_error"
# `--spec-dir`: the client did not prove an environment (no, wrong or unknown credentials).
PROXY_AUTH_REQUIRED = "proxy_auth_required"
# The entry's `requests` (SPEC §8) let no request with this method and path pass, or the
# path could not be normalised (egress/policy/request_rules.py).
REQUEST_NOT_ALLOWED = "request_not_allowed"
REASONS = (
    NOT_ALLOWLISTED,
    LOOPBACK,
    FORBIDDEN_ADDRESS,
    RESOLVE_FAILED,
    HOST_MISMATCH,
    PLAINTEXT_CREDENTIALS,
    TRACE_CREDENTIALS,
    PROXY_SELF,
    NO_SNI,
    INTERNAL_ERROR,
    PROXY_AUTH_REQUIRED,
    REQUEST_NOT_ALLOWED,
)
# Report mode lets would-be blocks pass, except these: the sandbox must never reach
# the machine it runs on or the proxy itself, not even while a policy is being trialled,
# and a name that did not resolve has no address to let anything pass to.
NEVER_REPORTED = frozenset({LOOPBACK, PROXY_SELF, RESOLVE_FAILED})

# The destination, once dialled (egress/net/upstream.py).
UPSTREAM_REFUSED = "upstream_refused"
UPSTREAM_UNREACHABLE = "upstream_unreachable"
UPSTREAM_TIMEOUT = "upstream_timeout"
UPSTREAM_REASONS = (UPSTREAM_REFUSED, UPSTREAM_UNREACHABLE, UPSTREAM_TIMEOUT)

# Credentials (egress/credentials, egress/addons/credentials.py).
CREDENTIAL_UNAVAILABLE = "credential_unavailable"  # 502: a token source could not give a token
PRESIGNED_URL = "presigned_url"  # 403: a SigV4 presigned URL on a `sign` entry (cannot be re-signed)
UNSIGNABLE_REQUEST = "unsignable_request"  # 403: a `sign` request the proxy cannot re-sign (see sigv4.py)
CREDENTIAL_REASONS = (CREDENTIAL_UNAVAILABLE, PRESIGNED_URL, UNSIGNABLE_REQUEST)

# Limits (egress/addons/limits.py, egress/addons/environment_gate.py).
CONNECTION_LIMIT = "connection_limit"  # 429: --max-connections-per-environment reached
READ_TIMEOUT = "read_timeout"  # 504: the upstream did not start its answer within --read-timeout

# DNS-only reason codes (beside not_allowlisted, loopback, forbidden_address,
# proxy_self, resolve_failed, internal_error).
MALFORMED = "malformed"  # unparsable, QDCOUNT != 1, a response sent to us: FORMERR or dropped
UNSUPPORTED = "unsupported"  # opcode other than QUERY, class other than IN, zone transfers: REFUSED
BAD_EDNS = "bad_edns"  # EDNS version we do not speak: BADVERS (RFC 6891)
HTTPS_RECORD = "https_record"  # HTTPS/SVCB of an allowlisted name: NODATA
REVERSE_LOOKUP = "reverse_lookup"  # PTR: NXDOMAIN, never forwarded
QTYPE_NOT_SERVED = "qtype_not_served"  # TXT, MX, ANY, ... of an allowlisted name: NODATA
DNS_REASONS = (MALFORMED, UNSUPPORTED, BAD_EDNS, HTTPS_RECORD, REVERSE_LOOKUP, QTYPE_NOT_SERVED)
