//! The device login (RFC 8628) for SSH sessions and headless machines: show
//! the verification URL and code, then poll the token endpoint, honouring
//! `authorization_pending` and `slow_down`, until the person signs in, the
//! code expires, or the sign-in is declined.

use std::time::Duration;

use openidconnect::core::CoreDeviceAuthorizationResponse;

use super::{LoginClient, LoginError, Tokens, with_progress};

pub async fn login(provider: &LoginClient) -> Result<Tokens, LoginError> {
    let endpoint = provider
        .device_endpoint
        .clone()
        .ok_or(LoginError::NoDeviceEndpoint)?;
    crate::debug::note(format_args!(
        "device login: the code is asked for at {}, then the token endpoint is polled",
        endpoint.url()
    ));
    let client = provider.client.clone().set_device_authorization_url(endpoint);
    let mut request = client.exchange_device_code();
    for scope in provider.scopes() {
        request = request.add_scope(scope);
    }
    let details: CoreDeviceAuthorizationResponse = request
        .request_async(&provider.http)
        .await
        .map_err(|e| provider.failure(&e, LoginError::Refused))?;
    eprintln!(
        "{}",
        prompt(
            details.verification_uri().url().as_str(),
            details.user_code().secret()
        )
    );
    let expires = details.expires_in();
    let polling = client
        .exchange_device_access_token(&details)
        .map_err(|e| LoginError::Invalid(e.to_string()))?
        .request_async(
            &provider.http,
            tokio::time::sleep,
            Some(expires + Duration::from_secs(5)),
        );
    let response = with_progress(
        "Waiting for the sign-in on that page (Ctrl-C to cancel).",
        polling,
    )
    .await
    .map_err(|e| {
        provider.failure(&e, |text| {
            if text.contains("expired") {
                LoginError::DeviceExpired
            } else if text.contains("authorization_declined") || text.contains("access_denied") {
                LoginError::DeviceDeclined
            } else {
                LoginError::Refused(text)
            }
        })
    })?;
    provider.tokens_from(&response, None)
}

/// What the person is asked to do. Both values come from the identity
/// provider: the URL as the URL parser wrote it back (the text it was given
/// may still hold tabs or line breaks) and the code escaped.
fn prompt(uri: &str, code: &str) -> String {
    use talos_sso_text::escape;
    format!(
        "To log in, open\n\n    {}\n\nand enter the code\n\n    {}\n",
        escape(uri),
        escape(code)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_shows_the_providers_text_escaped() {
        let uri = openidconnect::EndUserVerificationUrl::new(
            "https://login.example.com/device\n\u{1b}[2Kfake".into(),
        )
        .unwrap();
        let shown = prompt(uri.url().as_str(), "ABCD\u{1b}[8m\u{202e}");
        assert_eq!(
            shown,
            "To log in, open\n\n    https://login.example.com/device%1B[2Kfake\n\n\
             and enter the code\n\n    ABCD\\u{1b}[8m\\u{202e}\n"
        );
    }
}
