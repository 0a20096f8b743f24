//! The "browser" that clicks through the provider's pages and the
//! console's: cookies per host, `Sec-Fetch-Site`, redirects and forms.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use super::html::first_form;
use super::html::link;

/// A page the browser ended on.
#[derive(Debug)]
pub struct Page {
    pub url: String,
    pub status: u16,
    pub body: String,
    /// Every URL of the navigation, the redirects followed and this page's
    /// own last: what went back and forth (the console's callback with its
    /// `code`, `state` and `iss`, say).
    pub chain: Vec<String>,
}

impl Page {
    /// The page at the end of `chain`.
    fn of(chain: &[url::Url], status: u16, body: String) -> Self {
        Self {
            url: chain.last().map(url::Url::to_string).unwrap_or_default(),
            status,
            body,
            chain: chain.iter().map(url::Url::to_string).collect(),
        }
    }
}

/// A person's browser, as far as the provider's and the console's pages
/// need one: cookies, redirects, forms, links, `Sec-Fetch-Site`.
///
/// Cookies are kept per host, as browsers keep them (RFC 6265, section
/// 8.5: cookies are not kept apart by port): the provider and the server
/// under test, both on 127.0.0.1 on different ports, each get the other's
/// cookies too, as they would from a browser, and must tell theirs by name.
/// Their `Path`, `Domain` and expiry are not kept; a cookie set empty (how
/// both clear theirs) is removed.
#[derive(Debug)]
pub struct Browser {
    http: reqwest::Client,
    provider: url::Url,
    user: String,
    /// Host, then name, then value.
    cookies: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
}

impl Browser {
    /// A browser with no cookies yet, in which `user` signs in at `provider`.
    pub(super) fn new(provider: url::Url, user: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(20))
                .build()
                .expect("client"),
            provider,
            user: user.to_owned(),
            cookies: Mutex::new(BTreeMap::new()),
        }
    }

    /// Open `url` as if typed, and follow redirects (at most 20) to the
    /// page they end on.
    pub async fn visit(&self, url: &str) -> Page {
        self.go(url::Url::parse(url).expect("URL"), None, None, None)
            .await
    }

    /// As [`Self::visit`], but stop at the first redirect to a URL that
    /// starts with `prefix`, without opening it: the page is that URL, with
    /// the status of the redirect and no body. How a test holds on to an
    /// authorization response (its `code`, `state`, `iss`) to replay or
    /// change it.
    pub async fn visit_until(&self, url: &str, prefix: &str) -> Page {
        self.go(url::Url::parse(url).expect("URL"), None, None, Some(prefix))
            .await
    }

    /// Follow the first link on `page` whose text contains `text`.
    pub async fn follow(&self, page: &Page, text: &str) -> Page {
        let href = link(&page.body, text).unwrap_or_else(|| {
            panic!(
                "no link \"{text}\" on {} ({}): {}",
                page.url, page.status, page.body
            )
        });
        let base = url::Url::parse(&page.url).expect("page URL");
        let target = base.join(&href).expect("link");
        self.go(target, None, Some(base.origin()), None).await
    }

    /// The cookie `name` this browser holds for `url`'s host, if any.
    pub fn cookie(&self, url: &str, name: &str) -> Option<String> {
        let host = url::Url::parse(url).ok()?.host_str()?.to_owned();
        let jar = self.cookies.lock().expect("jar");
        jar.get(&host)?.get(name).cloned()
    }

    /// Approve the device login `user_code` from `verification_uri`: the
    /// code entered, the confirmation accepted, the sign-in done. Returns
    /// the last page.
    pub async fn approve_device(&self, verification_uri: &str, user_code: &str) -> Page {
        let mut url = url::Url::parse(verification_uri).expect("verification URI");
        url.query_pairs_mut().append_pair("user_code", user_code);
        // The provider posts the code to itself (a form a script submits),
        // then asks to confirm it.
        let posted = self.submit_form(&self.go(url, None, None, None).await).await;
        self.submit_form(&posted).await
    }

    /// Submit the first form on `page` with its hidden inputs.
    pub async fn submit_form(&self, page: &Page) -> Page {
        let (action, fields) = first_form(&page.body)
            .unwrap_or_else(|| panic!("no form on {} ({}): {}", page.url, page.status, page.body));
        let base = url::Url::parse(&page.url).expect("page URL");
        let target = base.join(&action).expect("form action");
        self.go(target, Some(fields), Some(base.origin()), None).await
    }

    /// Navigate to `url` (posting `form`, if any) and follow redirects,
    /// up to one to a URL starting with `stop`; `initiator` is the origin
    /// of the page that started the navigation (a link, a form), none when
    /// typed.
    async fn go(
        &self,
        mut url: url::Url,
        mut form: Option<Vec<(String, String)>>,
        initiator: Option<url::Origin>,
        stop: Option<&str>,
    ) -> Page {
        let mut chain: Vec<url::Url> = Vec::new();
        let mut redirected = None;
        for _ in 0..20 {
            chain.push(url.clone());
            if let (Some(stop), Some(status)) = (stop, redirected)
                && url.as_str().starts_with(stop)
            {
                return Page::of(&chain, status, String::new());
            }
            let mut request = match &form {
                Some(fields) => self.http.post(url.clone()).form(fields),
                None => self.http.get(url.clone()),
            };
            request = request.header("sec-fetch-site", fetch_site(initiator.as_ref(), &chain));
            if url.origin() == self.provider.origin() {
                request = request.header("x-test-login", &self.user);
            }
            let cookies = self.cookie_header(&url);
            if !cookies.is_empty() {
                request = request.header(reqwest::header::COOKIE, cookies);
            }
            let response = request
                .send()
                .await
                .unwrap_or_else(|e| panic!("GET/POST {url}: {e}"));
            self.keep_cookies(&url, &response);
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_else(|| panic!("a redirect without Location from {url}"))
                    .to_owned();
                url = url.join(&location).expect("Location");
                redirected = Some(status.as_u16());
                // 303 (and, as browsers do, 301/302) turn a POST into a GET.
                form = None;
                continue;
            }
            let body = response.text().await.unwrap_or_default();
            return Page::of(&chain, status.as_u16(), body);
        }
        panic!("more than 20 redirects, the last to {url}");
    }

    /// The `Cookie` header for `url`: every cookie of its host.
    fn cookie_header(&self, url: &url::Url) -> String {
        let jar = self.cookies.lock().expect("jar");
        jar.get(url.host_str().unwrap_or_default())
            .into_iter()
            .flatten()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Keep each `Set-Cookie` of the answer from `url` for its host (name
    /// and value; an emptied one is removed, as the provider and the
    /// console clear cookies that way).
    fn keep_cookies(&self, url: &url::Url, response: &reqwest::Response) {
        let mut all = self.cookies.lock().expect("jar");
        let jar = all
            .entry(url.host_str().unwrap_or_default().to_owned())
            .or_default();
        for header in response.headers().get_all(reqwest::header::SET_COOKIE) {
            let Ok(text) = header.to_str() else { continue };
            let pair = text.split(';').next().unwrap_or_default();
            let Some((name, value)) = pair.split_once('=') else {
                continue;
            };
            if value.is_empty() {
                jar.remove(name.trim());
            } else {
                jar.insert(name.trim().to_owned(), value.to_owned());
            }
        }
    }
}

/// `Sec-Fetch-Site` of a navigation's request to the last URL of
/// `chain`, as the Fetch Metadata specification computes it: `none` for a
/// typed one, else the farthest any URL of the chain so far is from the
/// `initiator` (the page of the link or form). Same site is taken as same
/// scheme and host, which is what it is for the tests' hosts (an IP
/// address or `localhost` is a site of its own); no public suffix list.
fn fetch_site(initiator: Option<&url::Origin>, chain: &[url::Url]) -> &'static str {
    let Some(initiator) = initiator else {
        return "none";
    };
    let mut site = "same-origin";
    for url in chain {
        if url.origin() == *initiator {
            continue;
        }
        let same_site = match initiator {
            url::Origin::Tuple(scheme, host, _) => {
                url.scheme() == scheme && url.host_str() == Some(host.to_string().as_str())
            }
            url::Origin::Opaque(_) => false,
        };
        if !same_site {
            return "cross-site";
        }
        site = "same-site";
    }
    site
}
