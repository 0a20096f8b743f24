//! A console client without a browser, for tests and the console
//! benchmark: it follows no redirects, keeps the cookies it is given, and
//! logs in through the Entra emulator as its account picker's links do
//! (`login_hint`), checking the authorization request on the way.

use reqwest::header;

#[derive(Debug)]
/// A client that follows no redirects and keeps the cookies it is given.
pub struct Browserless {
    pub http: reqwest::Client,
    pub cookies: Vec<String>,
}

impl Default for Browserless {
    fn default() -> Self {
        Self::new()
    }
}

impl Browserless {
    pub fn new() -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookies: Vec::new(),
        }
    }

    fn keep(&mut self, response: &reqwest::Response) {
        for set in response.headers().get_all(header::SET_COOKIE) {
            let pair = set.to_str().unwrap().split(';').next().unwrap().to_owned();
            let name = pair.split('=').next().unwrap().to_owned();
            self.cookies.retain(|c| !c.starts_with(&format!("{name}=")));
            if !pair.ends_with('=') {
                self.cookies.push(pair);
            }
        }
    }

    /// A GET as a link on a console page makes it (`Sec-Fetch-Site:
    /// same-origin`, as browsers send).
    pub async fn get(&mut self, url: &str) -> reqwest::Response {
        let response = self
            .http
            .get(url)
            .header(header::COOKIE, self.cookies.join("; "))
            .header("sec-fetch-site", "same-origin")
            .send()
            .await
            .unwrap();
        self.keep(&response);
        response
    }

    pub async fn post(&mut self, url: &str, form: &[(&str, &str)]) -> reqwest::Response {
        let response = self
            .http
            .post(url)
            .header(header::COOKIE, self.cookies.join("; "))
            .form(form)
            .send()
            .await
            .unwrap();
        self.keep(&response);
        response
    }

    /// Log in as `user`: the console's redirect, the emulator's (with
    /// `login_hint`, as the account picker's links have), the callback.
    pub async fn login(&mut self, base: &str, user: &str, return_to: &str) {
        let start = self.get(&format!("{base}/ui/login?return={return_to}")).await;
        assert_eq!(start.status(), 303);
        let authorize = location(&start);
        let url = url::Url::parse(&authorize).unwrap();
        let query: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        assert_eq!(query["code_challenge_method"], "S256");
        assert_eq!(query["response_type"], "code");
        assert_eq!(query["redirect_uri"], format!("{base}/ui/callback"));
        assert!(!query["state"].is_empty() && !query["nonce"].is_empty());
        let at_provider = self.get(&format!("{authorize}&login_hint={user}")).await;
        assert_eq!(at_provider.status(), 302);
        let callback = self.get(&location(&at_provider)).await;
        assert_eq!(callback.status(), 303, "{:?}", callback.text().await);
        assert_eq!(location(&callback), return_to);
    }
}

pub fn location(response: &reqwest::Response) -> String {
    response.headers()[header::LOCATION].to_str().unwrap().to_owned()
}
