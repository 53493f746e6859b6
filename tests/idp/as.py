"""A real OAuth 2.0 authorization server for the integration tests.

Built on Authlib (grants, client authentication, PKCE, token endpoint,
revocation) and Flask; the token-exchange grant (RFC 8693), the JWT access
token claims and the test controls (/_log, /_mode) are ours. See README.md.

    python as.py CONFIG.json

Listens on 127.0.0.1:<port> only; logs to stderr; keeps all state in memory.
"""

import base64
import json
import secrets
import sys
import threading
import time
import uuid

from flask import Flask, g, jsonify, request
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, KeySet, RSAKey
from werkzeug.serving import run_simple

from authlib.integrations.flask_oauth2 import AuthorizationServer, client_authenticated
from authlib.oauth2.rfc6749 import (
    BaseGrant,
    ClientMixin,
    InvalidGrantError,
    InvalidRequestError,
    InvalidScopeError,
    OAuth2Error,
    TokenEndpointMixin,
    UnauthorizedClientError,
    grants,
)
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7523 import JWTBearerClientAssertion
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
TT_JWT = "urn:ietf:params:oauth:token-type:jwt"
TT_ACCESS = "urn:ietf:params:oauth:token-type:access_token"
ASSERTION_ALGS = ["RS256", "PS256", "ES256", "ES384", "EdDSA"]
# Subject tokens may also be HS256 (an "oct" key in subject_jwks), as the
# firewall's development tokens are. joserfc matches key type to alg.
SUBJECT_ALGS = ASSERTION_ALGS + ["HS256"]

CFG = json.load(open(sys.argv[1]))
PORT = int(CFG["port"])
ISS = CFG.get("issuer") or f"http://127.0.0.1:{PORT}"
LIFETIME = int(CFG.get("token_lifetime_s", 300))
USERS = CFG.get("users") or ["alice", "bob"]
DEFAULT_AUD = CFG["default_audience"]
SUBJECT_ISSUER = CFG["subject_issuer"]
SUBJECT_KEYS = KeySet.import_key_set(CFG["subject_jwks"])
# RFC 8693 §2.2.2 says invalid_request; many servers answer invalid_grant.
SUBJECT_ERROR = CFG.get("invalid_subject_error", "invalid_grant")
REUSE_REVOKES_FAMILY = CFG.get("refresh_reuse_revokes_family", True)

SIGNING_ALG = CFG.get("signing_alg", "ES256")
_kp = {"kid": "as-" + secrets.token_hex(4), "use": "sig", "alg": SIGNING_ALG}
KEY = (
    RSAKey.generate_key(2048, parameters=_kp)
    if SIGNING_ALG == "RS256"
    else ECKey.generate_key("P-256", parameters=_kp)
)
KID = _kp["kid"]

LOCK = threading.Lock()
CODES = {}  # code -> AuthCode record
REFRESH = {}  # live refresh token -> RefreshRecord
USED_REFRESH = {}  # rotated-away refresh token -> family id
SEEN_ASSERTION_JTI = set()
LOG = []  # one entry per token-endpoint request
MODE = {"mode": "ok", "times": None, "delay_s": 10.0}
MODES = ("ok", "refuse", "error500", "slow", "garbage", "notjson")


def eprint(*a):
    print("as.py:", *a, file=sys.stderr, flush=True)


def one_or_many(values):
    """A single form value as a string, several as a list, none as None."""
    values = [v for v in values if v]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


# --- clients and users -----------------------------------------------------


class Client(ClientMixin):
    def __init__(self, d):
        self.d = d
        if "token_endpoint_auth_method" in d:
            self.method = d["token_endpoint_auth_method"]
        elif "jwks" in d:
            self.method = "private_key_jwt"
        elif d.get("client_secret"):
            self.method = "client_secret_basic"
        else:
            self.method = "none"
        self.allowed = set((d.get("scope") or "").split()) if d.get("scope") else None

    def get_client_id(self):
        return self.d["client_id"]

    def get_default_redirect_uri(self):
        uris = self.d.get("redirect_uris") or []
        return uris[0] if uris else None

    def get_allowed_scope(self, scope):
        # Library-style: an authorization request's scope is narrowed to what
        # the client may have (the grants below refuse instead).
        if not scope:
            return ""
        if self.allowed is None:
            return scope
        return " ".join(s for s in scope.split() if s in self.allowed)

    def check_redirect_uri(self, uri):
        return uri in (self.d.get("redirect_uris") or [])

    def check_client_secret(self, secret):
        expected = self.d.get("client_secret") or ""
        return bool(expected) and secrets.compare_digest(secret, expected)

    def check_endpoint_auth_method(self, method, endpoint):
        return method == self.method

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type in (self.d.get("grant_types") or [])

    def check_scope(self, scope):
        """Refuses (invalid_scope) a scope the client may not have."""
        if scope and self.allowed is not None:
            extra = [s for s in scope.split() if s not in self.allowed]
            if extra:
                raise InvalidScopeError(f"scope not allowed for this client: {' '.join(extra)}")


CLIENTS = {c["client_id"]: Client(c) for c in CFG["clients"]}


class User:
    def __init__(self, sub):
        self.sub = sub

    def get_user_id(self):
        return self.sub


# --- the JWT access tokens (RFC 9068 profile) -----------------------------


class AccessTokens(JWTBearerTokenGenerator):
    """Signs every access token with KEY. The grants put the token's
    audience and extra claims in flask.g (`aud`, `claims`)."""

    def get_jwks(self):
        return KeySet([KEY])

    def access_token_generator(self, client, grant_type, user, scope):
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": str(user.get_user_id()) if user else client.get_client_id(),
            "aud": g.get("aud") or DEFAULT_AUD,
            "client_id": client.get_client_id(),
            "iat": now,
            "exp": now + self._get_expires_in(client, grant_type),
            "jti": uuid.uuid4().hex,
        }
        if scope:
            claims["scope"] = scope
        claims.update(g.get("claims") or {})
        header = {"alg": SIGNING_ALG, "typ": "at+jwt", "kid": KID}
        return jwt.encode(header, claims, KEY, algorithms=[SIGNING_ALG])


def target_audience(form, fallback=None):
    """RFC 8693 / RFC 8707: `audience` wins over `resource`; else fallback,
    else the configured default."""
    return (
        one_or_many(form.getlist("audience"))
        or one_or_many(form.getlist("resource"))
        or fallback
        or DEFAULT_AUD
    )


# --- grants ----------------------------------------------------------------

CONFIDENTIAL = ["client_secret_basic", "client_secret_post", "private_key_jwt"]
ANY_CLIENT = CONFIDENTIAL + ["none"]


class AuthCodeRecord(dict):
    def get_redirect_uri(self):
        return self["redirect_uri"]

    def get_scope(self):
        return self["scope"]

    def get_nonce(self):
        return None

    def get_auth_time(self):
        return self["auth_time"]

    # Read by CodeChallenge.
    @property
    def code_challenge(self):
        return self["code_challenge"]

    @property
    def code_challenge_method(self):
        return self["code_challenge_method"]


class RefreshRecord(dict):
    def check_client(self, client):
        return self["client_id"] == client.get_client_id()

    def get_scope(self):
        return self.get("scope", "")

    def get_expires_in(self):
        return 0

    def is_expired(self):
        return False

    def is_revoked(self):
        return False


class AuthorizationCode(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ANY_CLIENT

    def save_authorization_code(self, code, req):
        rec = AuthCodeRecord(
            code=code,
            client_id=req.client.get_client_id(),
            redirect_uri=req.payload.redirect_uri,
            scope=req.scope or "",
            resource=one_or_many(req.payload.datalist.get("resource", [])),
            code_challenge=req.payload.data.get("code_challenge"),
            code_challenge_method=req.payload.data.get("code_challenge_method"),
            user=req.user,
            auth_time=int(time.time()),
        )
        with LOCK:
            CODES[code] = rec

    def query_authorization_code(self, code, client):
        with LOCK:
            rec = CODES.get(code)
        if rec and rec["client_id"] == client.get_client_id():
            g.aud = target_audience(request.form, rec["resource"])
            g.grant_resource = one_or_many(request.form.getlist("resource")) or rec["resource"]
            return rec
        return None

    def delete_authorization_code(self, rec):
        with LOCK:
            CODES.pop(rec["code"], None)

    def authenticate_user(self, rec):
        return rec["user"]


class RefreshToken(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ANY_CLIENT
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation

    def authenticate_refresh_token(self, refresh_token):
        # Taken atomically: of two concurrent uses, one wins.
        with LOCK:
            rec = REFRESH.pop(refresh_token, None)
            if rec is None:
                family = USED_REFRESH.get(refresh_token)
                if family is not None:
                    g.refresh_reuse = True
                    if REUSE_REVOKES_FAMILY:
                        for t in [t for t, r in REFRESH.items() if r["family"] == family]:
                            del REFRESH[t]
                    eprint("refresh token reused; family", family,
                           "revoked" if REUSE_REVOKES_FAMILY else "kept")
                return None
            USED_REFRESH[refresh_token] = rec["family"]
        if rec["client_id"] != self.request.client.get_client_id():
            return None
        g.family = rec["family"]
        g.aud = target_audience(request.form, rec["resource"])
        g.grant_resource = one_or_many(request.form.getlist("resource")) or rec["resource"]
        return rec

    def authenticate_user(self, rec):
        return rec["user"]

    def revoke_old_credential(self, rec):
        pass  # already taken out of REFRESH


class ClientCredentials(grants.ClientCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = CONFIDENTIAL

    def validate_token_request(self):
        super().validate_token_request()
        self.request.client.check_scope(self.request.payload.scope)
        g.aud = target_audience(request.form)


class TokenExchange(BaseGrant, TokenEndpointMixin):
    """RFC 8693: a confidential client trades a subject token issued by
    `subject_issuer` for an access token of this server."""

    GRANT_TYPE = TOKEN_EXCHANGE
    TOKEN_ENDPOINT_AUTH_METHODS = CONFIDENTIAL

    def validate_token_request(self):
        form = self.request.form
        client = self.authenticate_token_endpoint_client()
        if not client.check_grant_type(TOKEN_EXCHANGE):
            raise UnauthorizedClientError(f"client may not use grant_type={TOKEN_EXCHANGE}")
        subject_token = form.get("subject_token")
        if not subject_token:
            raise InvalidRequestError("missing subject_token")
        if form.get("subject_token_type") not in (TT_JWT, TT_ACCESS):
            raise InvalidRequestError("missing or unsupported subject_token_type")
        requested = form.get("requested_token_type")
        if requested and requested not in (TT_ACCESS, TT_JWT):
            raise InvalidRequestError("unsupported requested_token_type")
        claims = self.validate_subject_token(subject_token)
        scope = self.request.payload.scope
        client.check_scope(scope)

        act = {"sub": client.get_client_id()}
        if isinstance(claims.get("act"), dict):
            act["act"] = claims["act"]  # the prior delegation chain
        extra = {"act": act}
        for name in ("run_id", "tenant_id"):
            if name in claims:
                extra[name] = claims[name]
        g.aud = target_audience(form)
        g.claims = extra
        self.request.client = client
        self.request.user = User(claims["sub"])

    @staticmethod
    def validate_subject_token(value):
        try:
            tok = jwt.decode(value, SUBJECT_KEYS, algorithms=SUBJECT_ALGS)
            options = {
                "iss": {"essential": True, "value": SUBJECT_ISSUER},
                "sub": {"essential": True},
                "exp": {"essential": True},
            }
            if CFG.get("subject_audience"):
                options["aud"] = {"essential": True, "values": [CFG["subject_audience"]]}
            jwt.JWTClaimsRegistry(leeway=0, **options).validate(tok.claims)
        except (JoseError, ValueError, TypeError) as e:
            err = InvalidRequestError if SUBJECT_ERROR == "invalid_request" else InvalidGrantError
            raise err(f"invalid subject_token: {getattr(e, 'description', None) or e}") from e
        g.subject = tok.claims
        return tok.claims

    def create_token_response(self):
        token = self.generate_token(
            user=self.request.user,
            scope=self.request.payload.scope,
            include_refresh_token=False,
        )
        token["issued_token_type"] = TT_ACCESS
        self.save_token(token)
        return 200, token, self.TOKEN_RESPONSE_HEADER


class S256Only(CodeChallenge):
    """PKCE with S256, required of every client (plain or none refused)."""

    DEFAULT_CODE_CHALLENGE_METHOD = "S256"
    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant, redirect_uri):
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("PKCE required: missing 'code_challenge'")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("PKCE required: code_challenge_method must be S256")
        super().validate_code_challenge(grant, redirect_uri)


class PrivateKeyJWT(JWTBearerClientAssertion):
    CLIENT_AUTH_METHOD = "private_key_jwt"

    def get_audiences(self):
        return [ISS, ISS + "/token"]

    def validate_jti(self, claims, jti):
        key = (claims["sub"], jti)
        with LOCK:
            if key in SEEN_ASSERTION_JTI:
                return False
            SEEN_ASSERTION_JTI.add(key)
        return True

    def resolve_client_public_key(self, client):
        return KeySet.import_key_set(client.d["jwks"])


class Revocation(RevocationEndpoint):
    CLIENT_AUTH_METHODS = ANY_CLIENT

    def query_token(self, token_string, token_type_hint):
        # Access tokens are self-contained JWTs: only refresh tokens revoke.
        with LOCK:
            return REFRESH.get(token_string)

    def revoke_token(self, token, req):
        with LOCK:
            for t in [t for t, r in REFRESH.items() if r is token]:
                del REFRESH[t]


def save_token(token, req):
    if "refresh_token" not in token:
        return
    rec = RefreshRecord(
        client_id=req.client.get_client_id(),
        user=req.user,
        scope=token.get("scope", ""),
        resource=g.get("grant_resource"),
        family=g.get("family") or uuid.uuid4().hex,
    )
    with LOCK:
        REFRESH[token["refresh_token"]] = rec


app = Flask(__name__)
server = AuthorizationServer(app, query_client=CLIENTS.get, save_token=save_token)
server.register_token_generator(
    "default",
    AccessTokens(
        ISS,
        alg=SIGNING_ALG,
        refresh_token_generator=lambda **kw: secrets.token_urlsafe(32),
        expires_generator=LIFETIME,
    ),
)
server.register_client_auth_method("private_key_jwt", PrivateKeyJWT())
server.register_grant(AuthorizationCode, [S256Only(required=True)])
server.register_grant(RefreshToken)
server.register_grant(ClientCredentials)
server.register_grant(TokenExchange)
server.register_endpoint(Revocation)


# --- HTTP endpoints -----------------------------------------------------------


@app.get("/.well-known/oauth-authorization-server")
def metadata():
    return {
        "issuer": ISS,
        "authorization_endpoint": ISS + "/authorize",
        "token_endpoint": ISS + "/token",
        "revocation_endpoint": ISS + "/revoke",
        "jwks_uri": ISS + "/jwks",
        "response_types_supported": ["code"],
        "grant_types_supported": [
            "authorization_code",
            "refresh_token",
            "client_credentials",
            TOKEN_EXCHANGE,
        ],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ANY_CLIENT,
        "token_endpoint_auth_signing_alg_values_supported": ASSERTION_ALGS,
        "revocation_endpoint_auth_methods_supported": ANY_CLIENT,
    }


@app.get("/jwks")
def jwks():
    return {"keys": [KEY.as_dict(private=False)]}


@app.get("/authorize")
def authorize():
    """Auto-approves as `login_hint` (default: the first user); an unknown
    user is refused (access_denied)."""
    name = request.args.get("login_hint") or USERS[0]
    user = User(name) if name in USERS else None
    try:
        grant = server.get_consent_grant(end_user=user)
    except OAuth2Error as error:
        return server.handle_error_response(None, error)
    return server.create_authorization_response(grant_user=user, grant=grant)


@app.post("/revoke")
def revoke():
    resp = server.create_endpoint_response("revocation")
    record({"endpoint": "revoke", "client_id": claimed_client_id(),
            "token_type_hint": request.form.get("token_type_hint"),
            "status": resp.status_code, "ok": resp.status_code == 200, "time": time.time()})
    return resp


def claimed_client_id():
    """Who the request says it is (before authentication)."""
    auth = request.authorization
    if auth and auth.type == "basic" and auth.username:
        return auth.username
    if request.form.get("client_id"):
        return request.form["client_id"]
    assertion = request.form.get("client_assertion") or ""
    try:
        p = assertion.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))).get("sub")
    except Exception:
        return None


def on_client_authenticated(sender, client=None, grant=None, **kw):
    g.client_id = client.get_client_id()


client_authenticated.connect(on_client_authenticated)


def take_mode():
    with LOCK:
        mode, delay = MODE["mode"], MODE["delay_s"]
        if MODE["times"] is not None:
            MODE["times"] -= 1
            if MODE["times"] <= 0:
                MODE.update(mode="ok", times=None)
    return mode, delay


@app.post("/token")
def token():
    form = request.form
    entry = {
        "time": time.time(),
        "grant_type": form.get("grant_type"),
        "client_id": claimed_client_id(),
    }
    for name in ("audience", "resource"):
        v = one_or_many(form.getlist(name))
        if v is not None:
            entry[name] = v
    for name in ("scope", "subject_token_type", "requested_token_type"):
        if form.get(name):
            entry[name] = form[name]

    mode, delay = take_mode()
    entry["mode"] = mode
    if mode == "slow":
        time.sleep(delay)
    if mode in ("refuse", "error500", "garbage", "notjson"):
        entry.update(ok=False, error="mode:" + mode)
        record(entry)
        if mode == "refuse":
            return jsonify(error="invalid_grant", error_description="refused by test mode"), 400
        if mode == "error500":
            return "internal server error (test mode)\n", 500, {"Content-Type": "text/plain"}
        if mode == "garbage":
            return jsonify(access_token=5, token_type=["Bearer"], expires_in="soon"), 200
        return "<html><body>not a token</body></html>", 200, {"Content-Type": "text/html"}

    resp = server.create_token_response()
    entry["status"] = resp.status_code
    body = resp.get_json(silent=True) or {}
    entry["ok"] = resp.status_code == 200
    if not entry["ok"]:
        entry["error"] = body.get("error")
        if body.get("error_description"):
            entry["error_description"] = body["error_description"]
    if g.get("client_id"):
        entry["client_id"] = g.client_id
    subject = g.get("subject")
    if subject:
        entry["subject_sub"] = subject.get("sub")
        for name in ("run_id", "tenant_id"):
            if name in subject:
                entry["subject_" + name] = subject[name]
    if g.get("refresh_reuse"):
        entry["refresh_reuse"] = True
    record(entry)
    return resp


def record(entry):
    with LOCK:
        LOG.append(entry)
    eprint("token", json.dumps({k: v for k, v in entry.items() if k != "time"}))


@app.get("/_log")
def get_log():
    with LOCK:
        return jsonify(list(LOG))


@app.delete("/_log")
def clear_log():
    with LOCK:
        LOG.clear()
    return "", 204


@app.get("/_mode")
def get_mode():
    with LOCK:
        return dict(MODE)


@app.post("/_mode")
def set_mode():
    body = request.get_json(force=True, silent=True) or {}
    mode = body.get("mode")
    if mode not in MODES:
        return jsonify(error=f"mode must be one of {MODES}"), 400
    with LOCK:
        MODE.update(
            mode=mode,
            times=int(body["times"]) if body.get("times") is not None else None,
            delay_s=float(body.get("delay_s", 10.0)),
        )
        state = dict(MODE)
    eprint("mode", state)
    return state


if __name__ == "__main__":
    eprint(f"issuer {ISS}, listening on 127.0.0.1:{PORT}")
    run_simple("127.0.0.1", PORT, app, threaded=True)
