"""End-to-end check of the test authorization server (as.py), stdlib HTTP only.

    python selfcheck.py                 # writes a config to a temp dir, starts
                                        # as.py on a free port, checks, stops it
    python selfcheck.py --dir D         # same, keeping config and keys in D
    python selfcheck.py --dir D --no-start
                                        # against `python as.py D/config.json`
                                        # already running (from a --dir D run)

Run it with the Python of the venv that has tests/idp/requirements.txt
(target/test-cache/idp-venv/bin/python once the Rust tests have made it).
Exits 0 when every check passed; prints one line per check.
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, OctKey, RSAKey
from authlib.oauth2.rfc7523 import private_key_jwt_sign

HERE = os.path.dirname(os.path.abspath(__file__))
TE = "urn:ietf:params:oauth:grant-type:token-exchange"
TT_JWT = "urn:ietf:params:oauth:token-type:jwt"
TT_ACCESS = "urn:ietf:params:oauth:token-type:access_token"
SUBJECT_ISS = "https://idp.test"
DEFAULT_AUD = "https://mcp.test"
LIFETIME = 120
CB = "http://127.0.0.1:9/cb"
HS_SECRET = b"test-secret-that-is-long-enough-for-hs256!"

PASSED, FAILED = [], []


def check(name, cond, detail=""):
    (PASSED if cond else FAILED).append(name)
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f"  -- {detail}"), flush=True)


# --- HTTP ---------------------------------------------------------------------


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **kw):
        return None


OPENER = urllib.request.build_opener(NoRedirect, urllib.request.ProxyHandler({}))


class Resp:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def http(method, url, form=None, auth=None, json_body=None, timeout=30):
    headers, data = {}, None
    if form is not None:
        data = urllib.parse.urlencode(form, doseq=True).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if json_body is not None:
        data = json.dumps(json_body).encode()
        headers["Content-Type"] = "application/json"
    if auth:
        raw = f"{urllib.parse.quote(auth[0])}:{urllib.parse.quote(auth[1])}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with OPENER.open(req, timeout=timeout) as r:
            return Resp(r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as e:
        return Resp(e.code, dict(e.headers), e.read())


# --- setup ----------------------------------------------------------------------


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_state(d):
    """config.json plus the private keys the checks sign with."""
    path = os.path.join(d, "state.json")
    if os.path.exists(path):
        st = json.load(open(path))
        return (
            st["config"],
            RSAKey.import_key(st["subject_key"]),
            ECKey.import_key(st["client_key"]),
        )
    port = free_port()
    subject = RSAKey.generate_key(2048, parameters={"kid": "subject-1", "alg": "RS256"})
    client = ECKey.generate_key("P-256", parameters={"kid": "client-1", "alg": "ES256"})
    te = [TE]
    code = ["authorization_code", "refresh_token"]
    cfg = {
        "port": port,
        "issuer": f"http://127.0.0.1:{port}",
        "subject_issuer": SUBJECT_ISS,
        "subject_jwks": {"keys": [subject.as_dict(private=False),
                                  {"kty": "oct", "kid": "subject-hs", "alg": "HS256",
                                   "k": base64.urlsafe_b64encode(HS_SECRET).rstrip(b"=").decode()}]},
        "default_audience": DEFAULT_AUD,
        "token_lifetime_s": LIFETIME,
        "users": ["alice", "bob"],
        "clients": [
            {"client_id": "proxy", "client_secret": "proxy-secret", "redirect_uris": [],
             "grant_types": te, "token_endpoint_auth_method": "client_secret_basic",
             "scope": "mcp read write"},
            {"client_id": "proxy-jwt", "jwks": {"keys": [client.as_dict(private=False)]},
             "redirect_uris": [], "grant_types": te,
             "token_endpoint_auth_method": "private_key_jwt"},
            {"client_id": "svc", "client_secret": "svc-secret", "redirect_uris": [],
             "grant_types": ["client_credentials"],
             "token_endpoint_auth_method": "client_secret_basic"},
            {"client_id": "web", "client_secret": "web-secret", "redirect_uris": [CB],
             "grant_types": code, "token_endpoint_auth_method": "client_secret_basic"},
            {"client_id": "pub", "redirect_uris": [CB], "grant_types": code,
             "token_endpoint_auth_method": "none"},
        ],
    }
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(path, "w") as f:
        json.dump({"config": cfg, "subject_key": subject.as_dict(private=True),
                   "client_key": client.as_dict(private=True)}, f)
    return cfg, subject, client


# --- the checks ------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--no-start", action="store_true")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="idp-selfcheck-")
    cfg, subject_key, client_key = make_state(d)
    iss = cfg["issuer"]
    proc = None
    if not args.no_start:
        log = open(os.path.join(d, "as.log"), "w")
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "as.py"),
                                 os.path.join(d, "config.json")], stdout=log, stderr=log)
    try:
        deadline = time.time() + 30
        while True:
            try:
                meta = http("GET", iss + "/.well-known/oauth-authorization-server", timeout=2)
                if meta.status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or (proc and proc.poll() is not None):
                sys.exit(f"as.py did not answer at {iss} (log: {d}/as.log)")
            time.sleep(0.1)
        run_checks(iss, meta.json(), subject_key, client_key)
    finally:
        if proc:
            proc.terminate()
            proc.wait()
        if not args.dir and not FAILED:
            shutil.rmtree(d, ignore_errors=True)
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


def run_checks(iss, meta, subject_key, client_key):
    token_ep = meta["token_endpoint"]
    http("DELETE", iss + "/_log")
    http("POST", iss + "/_mode", json_body={"mode": "ok"})

    # Metadata and keys.
    check("metadata issuer", meta["issuer"] == iss, meta)
    for k in ("authorization_endpoint", "token_endpoint", "jwks_uri", "revocation_endpoint"):
        check(f"metadata {k}", meta.get(k, "").startswith(iss + "/"), meta)
    check("metadata grant types", set(meta["grant_types_supported"]) >=
          {"authorization_code", "refresh_token", "client_credentials", TE}, meta)
    check("metadata PKCE S256 only", meta["code_challenge_methods_supported"] == ["S256"], meta)
    check("metadata auth methods", {"client_secret_basic", "private_key_jwt", "none"}
          <= set(meta["token_endpoint_auth_methods_supported"]), meta)
    jwks_doc = http("GET", meta["jwks_uri"]).json()
    check("jwks has a kid, no private part",
          jwks_doc["keys"] and all("kid" in k and "d" not in k for k in jwks_doc["keys"]), jwks_doc)
    as_keys = KeySet.import_key_set(jwks_doc)

    def verify(tok):
        t = jwt.decode(tok, as_keys, algorithms=["ES256", "RS256"])
        return t.header, t.claims

    now = int(time.time())

    def subject(claims=None, key=subject_key, kid="subject-1", **over):
        c = {"iss": SUBJECT_ISS, "sub": "alice", "aud": "mcp-firewall", "iat": now,
             "exp": now + 300, "run_id": "run-42", "tenant_id": "acme"}
        c.update(claims or {})
        for k, v in over.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        return jwt.encode({"alg": "RS256", "kid": kid}, c, key)

    def exchange(auth=("proxy", "proxy-secret"), **form):
        f = {"grant_type": TE, "subject_token": subject(), "subject_token_type": TT_JWT}
        f.update({k: v for k, v in form.items() if v is not None})
        for k in [k for k, v in form.items() if v is None]:
            f.pop(k, None)
        return http("POST", token_ep, form=f, auth=auth)

    # Token exchange, client_secret_basic.
    r = exchange(audience="https://upstream.test", scope="mcp read")
    body = r.json() or {}
    check("TE basic: 200", r.status == 200, (r.status, r.body))
    check("TE: issued_token_type", body.get("issued_token_type") == TT_ACCESS, body)
    check("TE: token_type Bearer", body.get("token_type") == "Bearer", body)
    check("TE: expires_in", body.get("expires_in") == LIFETIME, body)
    check("TE: scope in response", body.get("scope") == "mcp read", body)
    check("TE: no refresh token", "refresh_token" not in body, body)
    header, c = verify(body["access_token"])
    check("TE: header at+jwt with kid", header.get("typ") == "at+jwt" and header.get("kid")
          in {k["kid"] for k in jwks_doc["keys"]}, header)
    check("TE: iss", c.get("iss") == iss, c)
    check("TE: aud = audience", c.get("aud") == "https://upstream.test", c)
    check("TE: sub = subject's sub", c.get("sub") == "alice", c)
    check("TE: act = client", c.get("act") == {"sub": "proxy"}, c)
    check("TE: client_id", c.get("client_id") == "proxy", c)
    check("TE: scope claim", c.get("scope") == "mcp read", c)
    check("TE: run_id/tenant_id copied", c.get("run_id") == "run-42" and c.get("tenant_id") == "acme", c)
    check("TE: exp = iat + lifetime", c.get("exp") - c.get("iat") == LIFETIME, c)
    check("TE: jti", bool(c.get("jti")), c)
    c2 = verify(exchange(audience="https://upstream.test").json()["access_token"])[1]
    check("TE: jti unique", c2["jti"] != c["jti"], (c2, c))
    check("TE: no scope asked, no scope claim", "scope" not in c2, c2)
    c3 = verify(exchange(resource="https://res.test").json()["access_token"])[1]
    check("TE: aud = resource", c3["aud"] == "https://res.test", c3)
    c4 = verify(exchange(resource="https://res.test", audience="https://aud.test").json()["access_token"])[1]
    check("TE: audience wins over resource", c4["aud"] == "https://aud.test", c4)
    c5 = verify(exchange().json()["access_token"])[1]
    check("TE: default audience", c5["aud"] == DEFAULT_AUD, c5)
    r = exchange(subject_token=subject({"act": {"sub": "agent-7"}}), subject_token_type=TT_ACCESS)
    c6 = verify(r.json()["access_token"])[1]
    check("TE: access_token type accepted, act nested",
          c6.get("act") == {"sub": "proxy", "act": {"sub": "agent-7"}}, c6)

    hs = jwt.encode({"alg": "HS256", "kid": "subject-hs"},
                    {"iss": SUBJECT_ISS, "sub": "carol", "exp": now + 60}, OctKey.import_key(HS_SECRET))
    r = exchange(subject_token=hs)
    check("TE HS256 subject (oct key)", r.status == 200 and
          verify(r.json()["access_token"])[1].get("sub") == "carol", (r.status, r.body))
    hs_bad = jwt.encode({"alg": "HS256", "kid": "subject-hs"},
                        {"iss": SUBJECT_ISS, "sub": "carol", "exp": now + 60},
                        OctKey.import_key(b"another-secret-that-is-long-enough-too!!"))
    r = exchange(subject_token=hs_bad)
    check("TE HS256 subject, wrong secret: invalid_grant",
          (r.json() or {}).get("error") == "invalid_grant", (r.status, r.body))

    # Refusals.
    r = exchange(auth=("proxy", "wrong"))
    check("TE wrong secret: 401 invalid_client",
          r.status == 401 and (r.json() or {}).get("error") == "invalid_client", (r.status, r.body))
    r = exchange(auth=("nobody", "x"))
    check("TE unknown client: 401 invalid_client",
          r.status == 401 and (r.json() or {}).get("error") == "invalid_client", (r.status, r.body))
    forger = RSAKey.generate_key(2048)
    for name, tok in [
        ("forged signature", subject(key=forger)),
        ("expired", subject(exp=now - 5, iat=now - 100)),
        ("wrong issuer", subject(iss="https://evil.test")),
        ("no sub", subject(sub=None)),
        ("no exp", subject(exp=None)),
        ("not a JWT", "not-a-jwt"),
    ]:
        r = exchange(subject_token=tok)
        check(f"TE subject {name}: 400 invalid_grant",
              r.status == 400 and (r.json() or {}).get("error") == "invalid_grant", (r.status, r.body))
    r = exchange(subject_token_type=None)
    check("TE no subject_token_type: invalid_request",
          (r.json() or {}).get("error") == "invalid_request", (r.status, r.body))
    r = exchange(subject_token_type="urn:ietf:params:oauth:token-type:saml2")
    check("TE unsupported subject_token_type: invalid_request",
          (r.json() or {}).get("error") == "invalid_request", (r.status, r.body))
    r = exchange(subject_token=None)
    check("TE no subject_token: invalid_request",
          (r.json() or {}).get("error") == "invalid_request", (r.status, r.body))
    r = exchange(scope="mcp admin")
    check("TE scope beyond the client's: invalid_scope",
          (r.json() or {}).get("error") == "invalid_scope", (r.status, r.body))
    r = exchange(auth=("web", "web-secret"))
    check("TE by a client without the grant: unauthorized_client",
          (r.json() or {}).get("error") == "unauthorized_client", (r.status, r.body))

    # Token exchange, private_key_jwt.
    def assertion():
        a = private_key_jwt_sign(client_key, "proxy-jwt", token_ep, alg="ES256")
        return a.decode() if isinstance(a, bytes) else a

    a = assertion()
    pk = dict(client_assertion_type="urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
              client_assertion=a, audience="https://upstream.test")
    r = exchange(auth=None, **pk)
    ok = r.status == 200
    check("TE private_key_jwt: 200", ok, (r.status, r.body))
    if ok:
        c = verify(r.json()["access_token"])[1]
        check("TE private_key_jwt: act", c.get("act") == {"sub": "proxy-jwt"}, c)
    r = exchange(auth=None, **pk)
    check("TE private_key_jwt replayed assertion: invalid_client",
          (r.json() or {}).get("error") == "invalid_client", (r.status, r.body))
    other = ECKey.generate_key("P-256")
    bad = private_key_jwt_sign(other, "proxy-jwt", token_ep, alg="ES256")
    r = exchange(auth=None, **dict(pk, client_assertion=bad.decode() if isinstance(bad, bytes) else bad))
    check("TE private_key_jwt wrong key: invalid_client",
          (r.json() or {}).get("error") == "invalid_client", (r.status, r.body))

    # Test modes.
    def mode(m, **kw):
        return http("POST", iss + "/_mode", json_body=dict(mode=m, **kw))

    mode("refuse")
    r = exchange()
    check("mode refuse: 400 invalid_grant",
          r.status == 400 and (r.json() or {}).get("error") == "invalid_grant", (r.status, r.body))
    mode("error500")
    r = exchange()
    check("mode error500: 500", r.status == 500, r.status)
    mode("garbage")
    r = exchange()
    check("mode garbage: 200, ill-typed", r.status == 200 and (r.json() or {}).get("access_token") == 5,
          (r.status, r.body))
    mode("notjson")
    r = exchange()
    check("mode notjson: 200, not JSON", r.status == 200 and r.json() is None, (r.status, r.body))
    mode("refuse", times=1)
    r1, r2 = exchange(), exchange()
    check("mode refuse times=1, then ok", r1.status == 400 and r2.status == 200, (r1.status, r2.status))
    mode("slow", delay_s=1.5)
    t0 = time.time()
    r = exchange()
    took = time.time() - t0
    check("mode slow: delayed, then answers", r.status == 200 and took >= 1.4, (r.status, took))
    check("GET /_mode", http("GET", iss + "/_mode").json()["mode"] == "slow")
    mode("ok")
    check("bad mode refused", mode("sideways").status == 400)

    # Client credentials.
    r = http("POST", token_ep, form={"grant_type": "client_credentials",
                                     "resource": "https://api.test"}, auth=("svc", "svc-secret"))
    body = r.json() or {}
    check("client_credentials: 200, no refresh token",
          r.status == 200 and "refresh_token" not in body, (r.status, r.body))
    if r.status == 200:
        c = verify(body["access_token"])[1]
        check("client_credentials: sub = client, aud = resource",
              c.get("sub") == "svc" and c.get("aud") == "https://api.test", c)
    r = http("POST", token_ep, form={"grant_type": "client_credentials", "client_id": "pub"})
    check("client_credentials by a public client: invalid_client",
          (r.json() or {}).get("error") == "invalid_client", (r.status, r.body))

    # Authorization code + PKCE + refresh rotation.
    def authorize(client_id, challenge=None, method="S256", **extra):
        q = {"response_type": "code", "client_id": client_id, "redirect_uri": CB, "state": "st-1",
             "scope": "mcp"}
        if challenge:
            q["code_challenge"] = challenge
        if method:
            q["code_challenge_method"] = method
        q.update(extra)
        r = http("GET", iss + "/authorize?" + urllib.parse.urlencode(q))
        loc = r.headers.get("Location") or r.headers.get("location") or ""
        return r, urllib.parse.parse_qs(urllib.parse.urlparse(loc).query)

    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    _, q = authorize("web")
    check("authorize without PKCE: invalid_request redirect",
          q.get("error") == ["invalid_request"] and q.get("state") == ["st-1"], q)
    _, q = authorize("web", challenge=verifier, method="plain")
    check("authorize with plain PKCE: invalid_request", q.get("error") == ["invalid_request"], q)
    _, q = authorize("web", challenge=challenge, method=None)
    check("authorize without method: invalid_request", q.get("error") == ["invalid_request"], q)
    _, q = authorize("web", challenge=challenge, login_hint="mallory")
    check("authorize unknown user: access_denied", q.get("error") == ["access_denied"], q)
    r, q = authorize("web", challenge=challenge, resource="https://res.test")
    check("authorize: 302 with code and state", r.status == 302 and "code" in q and q.get("state") == ["st-1"],
          (r.status, q))

    def code_token(client_id, code, verifier, auth):
        f = {"grant_type": "authorization_code", "code": code, "redirect_uri": CB,
             "code_verifier": verifier}
        if not auth:
            f["client_id"] = client_id
        return http("POST", token_ep, form=f, auth=auth)

    web = ("web", "web-secret")
    r = code_token("web", q["code"][0], "x" * 50, web)
    check("code with wrong verifier: invalid_grant", (r.json() or {}).get("error") == "invalid_grant",
          (r.status, r.body))
    _, q = authorize("web", challenge=challenge, resource="https://res.test")
    r = code_token("web", q["code"][0], verifier, web)
    t = r.json() or {}
    check("code: 200 with refresh token", r.status == 200 and "refresh_token" in t, (r.status, r.body))
    c = verify(t["access_token"])[1]
    check("code: JWT sub alice, aud = authorize resource, act absent",
          c.get("sub") == "alice" and c.get("aud") == "https://res.test" and "act" not in c, c)
    r = code_token("web", q["code"][0], verifier, web)
    check("code reused: invalid_grant", (r.json() or {}).get("error") == "invalid_grant", (r.status, r.body))

    def refresh(rt, auth=web, client_id="web", **extra):
        f = {"grant_type": "refresh_token", "refresh_token": rt, **extra}
        if not auth:
            f["client_id"] = client_id
        return http("POST", token_ep, form=f, auth=auth)

    r = refresh(t["refresh_token"])
    t2 = r.json() or {}
    check("refresh: 200, rotated", r.status == 200 and t2.get("refresh_token") not in (None, t["refresh_token"]),
          (r.status, r.body))
    c = verify(t2["access_token"])[1]
    check("refresh: JWT keeps sub and resource", c.get("sub") == "alice" and c.get("aud") == "https://res.test", c)
    r = refresh(t["refresh_token"])
    check("refresh reuse: invalid_grant", (r.json() or {}).get("error") == "invalid_grant", (r.status, r.body))
    r = refresh(t2["refresh_token"])
    check("refresh after reuse: family revoked", (r.json() or {}).get("error") == "invalid_grant",
          (r.status, r.body))

    # Public client, bob, resource at the token request; revocation.
    _, q = authorize("pub", challenge=challenge, login_hint="bob")
    r = code_token("pub", q["code"][0], verifier, None)
    t = r.json() or {}
    check("public client code: 200", r.status == 200 and "refresh_token" in t, (r.status, r.body))
    c = verify(t["access_token"])[1]
    check("public client: sub bob, default aud", c.get("sub") == "bob" and c.get("aud") == DEFAULT_AUD, c)
    r = refresh(t["refresh_token"], auth=None, client_id="pub", resource="https://other.test")
    t2 = r.json() or {}
    check("public refresh with resource: aud", r.status == 200 and
          verify(t2["access_token"])[1].get("aud") == "https://other.test", (r.status, r.body))
    r = http("POST", iss + "/revoke", form={"token": t2["refresh_token"], "client_id": "pub",
                                             "token_type_hint": "refresh_token"})
    check("revoke: 200", r.status == 200, (r.status, r.body))
    r = refresh(t2["refresh_token"], auth=None, client_id="pub")
    check("refresh after revoke: invalid_grant", (r.json() or {}).get("error") == "invalid_grant",
          (r.status, r.body))
    r = refresh("made-up")
    check("unknown refresh token: invalid_grant", (r.json() or {}).get("error") == "invalid_grant",
          (r.status, r.body))

    # The log.
    log = http("GET", iss + "/_log").json()
    check("log: one entry per token request", len(log) >= 40, len(log))
    first = log[0]
    check("log: first exchange", first.get("grant_type") == TE and first.get("ok") is True
          and first.get("client_id") == "proxy" and first.get("audience") == "https://upstream.test"
          and first.get("scope") == "mcp read" and first.get("subject_sub") == "alice"
          and first.get("subject_run_id") == "run-42", first)
    check("log: resource recorded", any(e.get("resource") == "https://res.test" for e in log), log)
    check("log: wrong secret", any(e.get("error") == "invalid_client" and e.get("client_id") == "proxy"
                                   for e in log), log)
    check("log: refused mode", any(e.get("error") == "mode:refuse" and e.get("ok") is False for e in log), log)
    check("log: refresh reuse flagged", any(e.get("refresh_reuse") for e in log), log)
    check("log: private_key_jwt client", any(e.get("client_id") == "proxy-jwt" and e.get("ok") for e in log), log)
    check("log: every token request has grant_type, client_id, ok",
          all({"grant_type", "client_id", "ok"} <= set(e) for e in log if "endpoint" not in e), log)
    check("log: the revocation recorded", any(e.get("endpoint") == "revoke" and e.get("ok")
                                              and e.get("client_id") == "pub" for e in log), log)


if __name__ == "__main__":
    main()
