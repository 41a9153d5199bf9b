//! The Prometheus HTTP API (`/api/v1/query`, `/api/v1/query_range`), as
//! Prometheus, Thanos Query, Mimir and VictoriaMetrics serve it, with a
//! bearer token file, basic auth and a CA file. Three failures are told
//! apart: the server cannot be reached, it refused the query (its own
//! `errorType` and `error`), or the answer was not the API's.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("cannot reach the Prometheus API at {url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("{url}: the query was refused ({kind}: {message}); the query was: {query}")]
    BadQuery {
        url: String,
        kind: String,
        message: String,
        query: String,
    },
    #[error("{url}: HTTP {status}{hint}: {body}")]
    Http {
        url: String,
        status: u16,
        hint: &'static str,
        body: String,
    },
    #[error("{url}: not an answer of the Prometheus API ({cause}): {body}")]
    Decode {
        url: String,
        cause: String,
        body: String,
    },
    #[error("{what} {path}: {cause}")]
    File {
        what: &'static str,
        path: PathBuf,
        cause: String,
    },
}

/// How to reach the API.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `http://` or `https://`, up to the API's root (a Thanos or Mimir
    /// prefix such as `/prometheus` included).
    pub url: String,
    pub bearer_token_file: Option<PathBuf>,
    /// `user:password` or `user` with the password from `password_file`.
    pub basic_user: Option<String>,
    pub basic_password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub timeout: Duration,
    /// Say each query on stderr.
    pub show_queries: bool,
}

pub struct Client {
    show_queries: bool,
    agent: ureq::Agent,
    base: String,
    auth: Option<String>,
}

fn read_secret(what: &'static str, p: &PathBuf) -> Result<String, PromError> {
    std::fs::read_to_string(p)
        .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
        .map_err(|e| PromError::File {
            what,
            path: p.clone(),
            cause: e.to_string(),
        })
}

/// RFC 4648 base64 (basic auth).
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Client {
    pub fn new(a: &Access) -> Result<Client, PromError> {
        let mut cfg = ureq::Agent::config_builder()
            .timeout_global(Some(a.timeout))
            .http_status_as_error(false);
        if let Some(ca) = &a.ca_file {
            let pem = std::fs::read(ca).map_err(|e| PromError::File {
                what: "--ca-file",
                path: ca.clone(),
                cause: e.to_string(),
            })?;
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|i| match i {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(PromError::File {
                    what: "--ca-file",
                    path: ca.clone(),
                    cause: "no PEM certificate in it".into(),
                });
            }
            cfg = cfg.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                    .build(),
            );
        }
        let auth = if let Some(f) = &a.bearer_token_file {
            Some(format!("Bearer {}", read_secret("--bearer-token-file", f)?))
        } else if let Some(u) = &a.basic_user {
            let pair = match &a.basic_password_file {
                Some(f) => format!("{u}:{}", read_secret("--password-file", f)?),
                None => u.clone(),
            };
            Some(format!("Basic {}", base64(pair.as_bytes())))
        } else {
            None
        };
        Ok(Client {
            show_queries: a.show_queries,
            agent: cfg.build().into(),
            base: a.url.trim_end_matches('/').to_string(),
            auth,
        })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// GET `path` with `params`; the API's `data`.
    fn get(&self, path: &str, params: &[(&str, String)], query: &str) -> Result<Value, PromError> {
        let url = format!("{}{path}", self.base);
        if self.show_queries {
            let at: Vec<String> = params
                .iter()
                .skip(1)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            eprintln!("query [{}]: {query}", at.join(" "));
        }
        let mut req = self.agent.get(&url);
        for (k, v) in params {
            req = req.query(k, v);
        }
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let mut resp = req.call().map_err(|e| PromError::Unreachable {
            url: self.base.clone(),
            cause: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(512 << 20)
            .read_to_string()
            .map_err(|e| PromError::Unreachable {
                url: self.base.clone(),
                cause: e.to_string(),
            })?;
        let v: Result<Value, _> = serde_json::from_str(&body);
        let short = || body.chars().take(300).collect::<String>();
        match (status, v) {
            (_, Ok(v)) if v["status"] == "success" => Ok(v["data"].clone()),
            (400 | 422 | 503, Ok(v)) if v["status"] == "error" => Err(PromError::BadQuery {
                url: self.base.clone(),
                kind: v["errorType"].as_str().unwrap_or("error").to_string(),
                message: v["error"].as_str().unwrap_or("").to_string(),
                query: query.to_string(),
            }),
            (200, Err(e)) => Err(PromError::Decode {
                url: url.clone(),
                cause: e.to_string(),
                body: short(),
            }),
            (status, _) => Err(PromError::Http {
                url,
                status,
                hint: match status {
                    401 | 403 => " (check --bearer-token-file or --basic-auth)",
                    404 => " (is this the API's root? it should answer /api/v1/query)",
                    _ => "",
                },
                body: short(),
            }),
        }
    }

    /// An instant query at `time` (Unix seconds): its result vector.
    pub fn query(&self, q: &str, time: f64) -> Result<Vec<Value>, PromError> {
        let d = self.get(
            "/api/v1/query",
            &[("query", q.to_string()), ("time", format!("{time:.3}"))],
            q,
        )?;
        Ok(d["result"].as_array().cloned().unwrap_or_default())
    }

    /// A range query: its matrix.
    pub fn query_range(
        &self,
        q: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Value>, PromError> {
        let d = self.get(
            "/api/v1/query_range",
            &[
                ("query", q.to_string()),
                ("start", format!("{start:.3}")),
                ("end", format!("{end:.3}")),
                ("step", format!("{step:.3}")),
            ],
            q,
        )?;
        Ok(d["result"].as_array().cloned().unwrap_or_default())
    }
}

/// A sample's float value (a native histogram's has none: 0).
pub fn value(s: &Value) -> f64 {
    s["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| v.is_finite())
        .unwrap_or(0.0)
}

/// A label of a sample's metric, "" when absent.
pub fn label<'a>(s: &'a Value, name: &str) -> &'a str {
    s["metric"][name].as_str().unwrap_or("")
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_as_rfc_4648() {
        assert_eq!(super::base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(super::base64(b"a"), "YQ==");
        assert_eq!(super::base64(b"ab"), "YWI=");
        assert_eq!(super::base64(b""), "");
    }
}
