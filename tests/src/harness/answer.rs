//! HTTP answers as the tests read them.

/// Send `request` and read its answer as JSON (for calls to the identity
/// providers, whose answers the tests take apart themselves).
pub async fn json_of(request: reqwest::RequestBuilder) -> serde_json::Value {
    request
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("a JSON answer")
}

/// An HTTP answer as the tests read it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The JSON body; `Null` when the body is not JSON.
    pub body: serde_json::Value,
    /// `X-Request-Id`, empty when absent.
    pub request_id: String,
    /// `Content-Type`, empty when absent.
    pub content_type: String,
}

impl Answer {
    pub async fn read(response: reqwest::Response) -> Self {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default()
        };
        let (request_id, content_type) = (header("x-request-id"), header("content-type"));
        Self {
            status: response.status().as_u16(),
            body: response.json().await.unwrap_or(serde_json::Value::Null),
            request_id,
            content_type,
        }
    }

    /// The problem's `code`, if any.
    pub fn code(&self) -> Option<&str> {
        self.body["code"].as_str()
    }
}
