//! One `[[upstream]]` checked into an [`Upstream`]: its name and URL, its
//! TLS trust, the headers it gets (injected credentials, identity, what the
//! client may forward), the methods it adds to MCP, and for a stdio server
//! the command, environment and sandbox. Every error names the key.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use http::header::HeaderName;
use http::Uri;

use super::validate::{sorted, ConfigError, ServerConfig, Validator};
use super::{
    ExtraMethod, IdentityClaim, RawExtraMethod, RawHeaderValue, RawUpstream, Secret, Upstream,
};
use crate::http_util::is_hop_by_hop;
use crate::mcp::methods::Shape;
use crate::policy::Risk;

impl Validator<'_> {
    /// The `i`th `[[upstream]]`, its limits defaulting to `server`'s.
    pub(super) fn upstream(
        &self,
        i: usize,
        mut u: RawUpstream,
        server: &ServerConfig,
        token_header: &HeaderName,
        host: &crate::stdio::HostConfig,
    ) -> Result<Upstream, ConfigError> {
        let key = |k: &str| format!("upstream[{i}].{k}");
        let name_ok = !u.name.is_empty()
            && u.name.len() <= 64
            && u.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(self.invalid(
                key("name"),
                format!("{:?} must be 1-64 characters of [A-Za-z0-9_-]", u.name),
            ));
        }
        let stdio = self.stdio(&key, &mut u, host)?;
        let (url, tls) = self.upstream_url(&key, &u.url)?;
        let ca_file = self.ca_file(&key, u.ca_file.take(), tls)?;
        for (k, v) in [
            ("connect_timeout_ms", u.connect_timeout_ms),
            ("request_timeout_ms", u.request_timeout_ms),
            ("idle_timeout_ms", u.idle_timeout_ms),
            ("http2_max_streams", u.http2_max_streams as u64),
        ] {
            if v == 0 {
                return Err(self.invalid(key(k), "must be greater than 0"));
            }
        }
        let auth = self.upstream_auth(&key, &mut u)?;
        let inject = self.inject(&key, std::mem::take(&mut u.headers), token_header)?;
        let identity_headers = self.identity_headers(
            &key,
            std::mem::take(&mut u.identity_headers),
            token_header,
            &inject,
        )?;
        let forward_headers = self.forward_headers(
            &key,
            &u.forward_headers,
            token_header,
            &identity_headers,
            &inject,
        )?;
        let mut extra_methods: Vec<ExtraMethod> = Vec::with_capacity(u.extra_methods.len());
        for (j, m) in u.extra_methods.into_iter().enumerate() {
            extra_methods.push(self.extra_method(&key(&format!("extra_methods[{j}]")), m)?);
        }
        Ok(Upstream {
            pinning: u.pinning,
            forward_headers,
            forward_query: u.forward_query,
            extra_methods,
            name: u.name,
            url,
            tls,
            ca_file,
            connect_timeout: Duration::from_millis(u.connect_timeout_ms),
            request_timeout: Duration::from_millis(u.request_timeout_ms),
            idle_timeout: Duration::from_millis(u.idle_timeout_ms),
            max_request_bytes: u.max_request_bytes.unwrap_or(server.max_request_bytes),
            max_response_bytes: u.max_response_bytes.unwrap_or(server.max_response_bytes),
            http2: u.http2,
            http2_max_streams: u.http2_max_streams,
            max_calls_per_s: u.max_calls_per_s,
            inject,
            identity_headers,
            projects: sorted(u.projects),
            categories: sorted(u.categories),
            trust_annotations: u.trust_annotations,
            untrusted: u.trust == super::Trust::Untrusted,
            private: u.data == super::DataClass::Private,
            egress: u.egress,
            stdio,
            auth,
        })
    }

    /// An upstream's `url`: absolute `http://` or `https://` (whether it is
    /// TLS) with a host.
    fn upstream_url(
        &self,
        key: &dyn Fn(&str) -> String,
        text: &str,
    ) -> Result<(Uri, bool), ConfigError> {
        let url: Uri = text
            .parse()
            .map_err(|e| self.invalid(key("url"), format!("{text:?} is not a URL: {e}")))?;
        let tls = match url.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(self.invalid(
                    key("url"),
                    format!("{text:?} must start with http:// or https://"),
                ))
            }
        };
        if url.host().is_none() {
            return Err(self.invalid(key("url"), format!("{text:?} has no host")));
        }
        Ok((url, tls))
    }

    /// An upstream's `ca_file`: only for `https://` (`tls`), and a readable
    /// file.
    pub(super) fn ca_file(
        &self,
        key: &dyn Fn(&str) -> String,
        ca_file: Option<PathBuf>,
        tls: bool,
    ) -> Result<Option<PathBuf>, ConfigError> {
        match ca_file {
            Some(p) if !tls => Err(self.invalid(
                key("ca_file"),
                format!("{} given for a plain http:// upstream", p.display()),
            )),
            Some(p) => {
                let p = self.path(&p);
                if !p.is_file() {
                    return Err(self.invalid(
                        key("ca_file"),
                        format!("{} is not a readable file", p.display()),
                    ));
                }
                Ok(Some(p))
            }
            None => Ok(None),
        }
    }

    /// An upstream's `headers`: the credentials injected into every
    /// request, never a header the proxy manages or the token's.
    fn inject(
        &self,
        key: &dyn Fn(&str) -> String,
        headers: BTreeMap<String, RawHeaderValue>,
        token_header: &HeaderName,
    ) -> Result<Vec<(HeaderName, Secret)>, ConfigError> {
        let mut inject = Vec::with_capacity(headers.len());
        for (h, v) in headers {
            let hk = key(&format!("headers.{h}"));
            let name = HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| self.invalid(&hk, "not a valid HTTP header name"))?;
            if is_hop_by_hop(&name)
                || name == http::header::HOST
                || name == http::header::CONTENT_LENGTH
            {
                return Err(self.invalid(
                    &hk,
                    "this header is managed by the proxy and cannot be injected",
                ));
            }
            if name == *token_header {
                return Err(self.invalid(&hk, "the tool-token header is never sent upstream"));
            }
            inject.push((name, self.secret(&hk, v)?));
        }
        Ok(inject)
    }

    /// An upstream's `identity_headers`: a header per claim, none that
    /// carries anything else or is already injected.
    fn identity_headers(
        &self,
        key: &dyn Fn(&str) -> String,
        headers: BTreeMap<String, String>,
        token_header: &HeaderName,
        inject: &[(HeaderName, Secret)],
    ) -> Result<Vec<(HeaderName, IdentityClaim)>, ConfigError> {
        let mut identity_headers = Vec::with_capacity(headers.len());
        for (h, claim) in headers {
            let hk = key(&format!("identity_headers.{h}"));
            let name = HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| self.invalid(&hk, "not a valid HTTP header name"))?;
            if is_hop_by_hop(&name)
                || name == http::header::HOST
                || name == http::header::AUTHORIZATION
                || name == *token_header
            {
                return Err(self.invalid(&hk, "this header cannot carry identity"));
            }
            if inject.iter().any(|(n, _)| *n == name) {
                return Err(self.invalid(&hk, "also set under `headers`"));
            }
            let claim = IdentityClaim::parse(&claim).ok_or_else(|| {
                self.invalid(
                    &hk,
                    format!("{claim:?} is not one of sub, tenant_id, agent, run_id, mode, jti, iss, projects"),
                )
            })?;
            identity_headers.push((name, claim));
        }
        Ok(identity_headers)
    }

    /// An upstream's `forward_headers`: client headers passed on, none the
    /// firewall manages or sets itself.
    fn forward_headers(
        &self,
        key: &dyn Fn(&str) -> String,
        headers: &[String],
        token_header: &HeaderName,
        identity_headers: &[(HeaderName, IdentityClaim)],
        inject: &[(HeaderName, Secret)],
    ) -> Result<Vec<HeaderName>, ConfigError> {
        let mut forward_headers = Vec::with_capacity(headers.len());
        for (j, h) in headers.iter().enumerate() {
            let hk = key(&format!("forward_headers[{j}]"));
            let name = HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| self.invalid(&hk, "not a valid HTTP header name"))?;
            if is_hop_by_hop(&name)
                || matches!(
                    name.as_str(),
                    "host"
                        | "authorization"
                        | "cookie"
                        | "content-length"
                        | "mcp-session-id"
                        | "last-event-id"
                        | "origin"
                        | "forwarded"
                        | "x-forwarded-for"
                        | "x-forwarded-host"
                        | "x-forwarded-proto"
                        | crate::stdio::INSTANCE_HEADER
                )
                || name == *token_header
                || identity_headers.iter().any(|(n, _)| *n == name)
                || inject.iter().any(|(n, _)| *n == name)
            {
                return Err(self.invalid(
                    &hk,
                    "this header is managed by the firewall and cannot be forwarded from the client",
                ));
            }
            forward_headers.push(name);
        }
        Ok(forward_headers)
    }

    /// The stdio part of an upstream: checked (the program found, the
    /// sandbox's paths present, the allow-list parsed) or refused naming
    /// the key; with `transport = "stdio"`, `url` becomes a placeholder.
    fn stdio(
        &self,
        key: &dyn Fn(&str) -> String,
        u: &mut RawUpstream,
        host: &crate::stdio::HostConfig,
    ) -> Result<Option<crate::stdio::Launch>, ConfigError> {
        use super::UpstreamTransport;
        let stdio_keys = [
            ("command", !u.command.is_empty()),
            ("env", !u.env.is_empty()),
            ("env_from", !u.env_from.is_empty()),
            ("instances", u.instances.is_some()),
            ("max_instances", u.max_instances.is_some()),
            ("idle_timeout_s", u.idle_timeout_s.is_some()),
            ("sandbox", u.sandbox.is_some()),
        ];
        if u.transport == UpstreamTransport::Http {
            if let Some((k, _)) = stdio_keys.iter().find(|(_, set)| *set) {
                return Err(self.invalid(key(k), "only with transport = \"stdio\""));
            }
            return Ok(None);
        }
        if !u.url.is_empty() {
            return Err(self.invalid(
                key("url"),
                "not used with transport = \"stdio\" (the firewall starts `command`)",
            ));
        }
        if u.http2 || u.ca_file.is_some() {
            let k = if u.http2 { "http2" } else { "ca_file" };
            return Err(self.invalid(key(k), "not used with transport = \"stdio\""));
        }
        u.url = format!("http://{}.stdio.invalid/", u.name);
        let command = self.stdio_command(key, &u.command)?;
        let env = self.stdio_env(key, &u.env, &u.env_from)?;
        let sandbox = self.sandbox(key, u.sandbox.take().unwrap_or_default())?;
        let max_instances = u.max_instances.unwrap_or(32);
        if !(1..=4096).contains(&max_instances) {
            return Err(self.invalid(key("max_instances"), "must be 1-4096"));
        }
        let idle = u.idle_timeout_s.unwrap_or(300);
        if idle == 0 {
            return Err(self.invalid(key("idle_timeout_s"), "must be greater than 0"));
        }
        Ok(Some(crate::stdio::Launch {
            command,
            env,
            env_from: u.env_from.clone(),
            instances: u.instances.unwrap_or_default(),
            max_instances,
            idle_timeout: Duration::from_secs(idle),
            sandbox,
            host: host.clone(),
        }))
    }

    /// A stdio upstream's `command`, its program resolved to a path.
    fn stdio_command(
        &self,
        key: &dyn Fn(&str) -> String,
        command: &[String],
    ) -> Result<Vec<String>, ConfigError> {
        let program = command.first().cloned().unwrap_or_default();
        if program.is_empty() {
            return Err(self.invalid(key("command"), "must name the program to start"));
        }
        let Some(resolved) = crate::stdio::which(&program) else {
            return Err(self.invalid(
                key("command"),
                format!("{program:?} is not an executable file nor on PATH"),
            ));
        };
        let mut command = command.to_vec();
        command[0] = resolved.display().to_string();
        Ok(command)
    }

    /// A stdio upstream's `env` (what it gets) and `env_from` (names of the
    /// firewall's own environment, each set): never `PATH`, `HOME` or
    /// `TMPDIR`, which the firewall sets.
    fn stdio_env(
        &self,
        key: &dyn Fn(&str) -> String,
        vars: &BTreeMap<String, String>,
        env_from: &[String],
    ) -> Result<Vec<(String, String)>, ConfigError> {
        let reserved = ["PATH", "HOME", "TMPDIR"];
        let mut env = Vec::with_capacity(vars.len());
        for (k, v) in vars {
            let ok = !k.is_empty()
                && !k.contains(['=', '\0'])
                && !v.contains('\0')
                && !reserved.contains(&k.as_str());
            if !ok {
                return Err(self.invalid(
                    key(&format!("env.{k}")),
                    "a variable name without `=`, not PATH, HOME or TMPDIR (set by the firewall)",
                ));
            }
            env.push((k.clone(), v.clone()));
        }
        for (j, name) in env_from.iter().enumerate() {
            if name.is_empty() || name.contains(['=', '\0']) || reserved.contains(&name.as_str()) {
                return Err(self.invalid(
                    key(&format!("env_from[{j}]")),
                    "a variable name without `=`, not PATH, HOME or TMPDIR",
                ));
            }
            if (self.env)(name).is_none() {
                return Err(self.invalid(
                    key(&format!("env_from[{j}]")),
                    format!("{name} is not set in the firewall's environment"),
                ));
            }
        }
        Ok(env)
    }

    /// A stdio upstream's `[upstream.sandbox]`: its paths resolved and
    /// present, its network allow-list parsed, its limits above 0.
    fn sandbox(
        &self,
        key: &dyn Fn(&str) -> String,
        mut sandbox: crate::sandbox::Spec,
    ) -> Result<crate::sandbox::Spec, ConfigError> {
        for (list, name) in [(&mut sandbox.read, "read"), (&mut sandbox.write, "write")] {
            for (j, p) in list.iter_mut().enumerate() {
                let full = self.path(p);
                if !full.exists() {
                    return Err(self.invalid(
                        key(&format!("sandbox.{name}[{j}]")),
                        format!("{} does not exist", full.display()),
                    ));
                }
                *p = full;
            }
        }
        if let crate::sandbox::Network::Allow(pairs) = &sandbox.network {
            for (j, p) in pairs.iter().enumerate() {
                if crate::stdio::egress::parse_pair(p).is_none() {
                    return Err(self.invalid(
                        key(&format!("sandbox.network[{j}]")),
                        format!(
                            "{p:?} is not host:port (a host name or IP address, a port 1-65535)"
                        ),
                    ));
                }
            }
        }
        for (k, v) in [
            ("sandbox.memory_mb", sandbox.memory_mb),
            ("sandbox.cpu_s", sandbox.cpu_s),
            ("sandbox.processes", sandbox.processes),
        ] {
            if v == Some(0) {
                return Err(self.invalid(key(k), "must be greater than 0"));
            }
        }
        Ok(sandbox)
    }

    /// One of an upstream's `extra_methods`: a name MCP does not define,
    /// its shape and its risk.
    fn extra_method(&self, key: &str, m: RawExtraMethod) -> Result<ExtraMethod, ConfigError> {
        let name_ok = !m.name.is_empty()
            && m.name.len() <= 128
            && m.name.bytes().all(|b| b.is_ascii_graphic());
        if !name_ok {
            return Err(self.invalid(
                format!("{key}.name"),
                format!("{:?} must be 1-128 visible ASCII characters", m.name),
            ));
        }
        if crate::mcp::methods::METHODS
            .iter()
            .any(|k| k.name == m.name)
        {
            return Err(self.invalid(
                format!("{key}.name"),
                format!(
                    "{:?} is an MCP method; it is decided by the firewall itself",
                    m.name
                ),
            ));
        }
        let shape = match m.kind.as_str() {
            "request" => Shape::Request,
            "notification" => Shape::Notification,
            other => {
                return Err(self.invalid(
                    format!("{key}.kind"),
                    format!("{other:?} is not `request` or `notification`"),
                ))
            }
        };
        let risk: Risk = m.risk.parse().map_err(|e: crate::policy::UnknownRisk| {
            self.invalid(format!("{key}.risk"), e.to_string())
        })?;
        Ok(ExtraMethod {
            name: m.name,
            shape,
            risk,
        })
    }
}
