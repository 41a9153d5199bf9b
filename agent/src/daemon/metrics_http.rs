//! `GET /metrics`: the exposition format the scraper asks for in its
//! `Accept` header. Prometheus with native histograms on (`scrape_native_histograms`
//! in 3.x, `--enable-feature=native-histograms` in 2.40 and later) asks for
//! the protobuf exposition first, and only that one carries native
//! histograms; every other scraper gets the OpenMetrics text it always got
//! (or text 0.0.4 where it prefers `text/plain`).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::metrics::Metrics;

/// The most of a request the metrics server reads (line and headers).
pub(crate) const MAX_REQUEST_BYTES: u64 = 8 * 1024;

/// An exposition format the agent serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    OpenMetrics,
    PrometheusText,
    Protobuf,
}

impl Format {
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
            Format::Protobuf => {
                "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
            }
        }
    }

    pub(crate) fn body(self, m: &Metrics) -> Vec<u8> {
        match self {
            Format::OpenMetrics => m.encode().into_bytes(),
            Format::PrometheusText => m.encode_prometheus_text().into_bytes(),
            Format::Protobuf => m.encode_protobuf(),
        }
    }

    /// The format one media range of an `Accept` header names, if served.
    fn of_range(range: &str) -> Option<Format> {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next()?.to_ascii_lowercase();
        let params: Vec<(String, String)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| {
                (
                    k.trim().to_ascii_lowercase(),
                    v.trim().trim_matches('"').to_string(),
                )
            })
            .collect();
        let param = |k: &str| params.iter().find(|p| p.0 == k).map(|p| p.1.as_str());
        match media.as_str() {
            "application/vnd.google.protobuf" => (param("proto")
                == Some("io.prometheus.client.MetricFamily")
                && param("encoding") == Some("delimited"))
            .then_some(Format::Protobuf),
            "application/openmetrics-text" | "*/*" | "application/*" => Some(Format::OpenMetrics),
            "text/plain" | "text/*" => Some(Format::PrometheusText),
            _ => None,
        }
    }
}

/// The served format an `Accept` header prefers: the highest `q` (1 when
/// not given), the first listed of equals; q=0 refuses. No header, or
/// nothing we serve in it: OpenMetrics text, as before protobuf.
pub(crate) fn negotiate(accept: Option<&str>) -> Format {
    let mut best: Option<(f64, Format)> = None;
    for range in accept.unwrap_or("").split(',') {
        let Some(f) = Format::of_range(range) else {
            continue;
        };
        let q = range
            .split(';')
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(1.0);
        if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
            best = Some((q, f));
        }
    }
    best.map(|b| b.1).unwrap_or(Format::OpenMetrics)
}

/// Serve GET /metrics on `addr` in a background thread.
pub(crate) fn serve(
    addr: &str,
    metrics: Arc<Mutex<Metrics>>,
) -> std::io::Result<std::net::SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in l.incoming() {
                let Some(conn) = crate::socket::accepted(conn, "metrics") else {
                    continue;
                };
                answer(&conn, &metrics);
            }
        })?;
    Ok(local)
}

/// One request on a connection, answered and closed.
fn answer(conn: &std::net::TcpStream, metrics: &Mutex<Metrics>) {
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    // A client that never reads its answer cannot hold the server.
    let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(2)));
    // The request line and headers together: at most MAX_REQUEST_BYTES.
    let mut r = BufReader::new(std::io::Read::take(conn, MAX_REQUEST_BYTES));
    let mut first = String::new();
    if r.read_line(&mut first).is_err() {
        return;
    }
    let mut accept = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).map(|n| n == 0).unwrap_or(true) || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("accept") {
                accept = Some(v.trim().to_string());
            }
        }
    }
    let (status, ctype, body) = if first.starts_with("GET /metrics") {
        let f = negotiate(accept.as_deref());
        let body = metrics.lock().map(|m| f.body(&m)).unwrap_or_default();
        ("200 OK", f.content_type(), body)
    } else {
        ("404 Not Found", "text/plain", b"try /metrics\n".to_vec())
    };
    let mut w = conn;
    let _ = write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = w.write_all(&body);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Accept headers the scrapers send, from their sources: Prometheus
    /// 2.42 `scrape/scrape.go` (`scrapeAcceptHeader`, and with native
    /// histograms on `scrapeAcceptHeaderWithProtobuf`), Prometheus 3.x's
    /// default `scrape_protocols` with native histograms, curl.
    #[test]
    fn the_format_is_the_one_the_scraper_prefers() {
        let prom_2_42 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let prom_2_42_native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let prom_3_native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4,application/openmetrics-text;version=0.0.1;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        let prom_3_classic = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        for (accept, want) in [
            (Some(prom_2_42), Format::OpenMetrics),
            (Some(prom_2_42_native), Format::Protobuf),
            (Some(prom_3_native), Format::Protobuf),
            (Some(prom_3_classic), Format::OpenMetrics),
            (Some("*/*"), Format::OpenMetrics),
            (None, Format::OpenMetrics),
            (Some(""), Format::OpenMetrics),
            (Some("text/plain"), Format::PrometheusText),
            (Some("text/plain;q=0.9, application/openmetrics-text;q=0.2"), Format::PrometheusText),
            // The text-delimited protobuf (and the OpenMetrics protobuf) is not served.
            (Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"), Format::OpenMetrics),
            (Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0, text/plain;q=0.1"), Format::PrometheusText),
            (Some("image/png"), Format::OpenMetrics),
        ] {
            assert_eq!(negotiate(accept), want, "{accept:?}");
        }
    }
}
