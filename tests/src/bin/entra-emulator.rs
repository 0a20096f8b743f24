//! `entra-emulator`: run the Entra ID emulator on a fixed address, for the
//! quick-start demo and for trying the CLI by hand.

use std::net::SocketAddr;

use talos_sso_tests::emulator::{CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, TENANT_ID};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let address: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8400".into())
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("address: {e}")))?;
    let emulator = EmulatorHandle::start_on(address, EmulatorConfig::default()).await?;
    println!("Entra ID emulator on {}", emulator.base_url);
    println!("  tenant    {TENANT_ID}");
    println!("  issuer    {}", emulator.issuer());
    println!("  client id {CLI_CLIENT_ID}");
    for user in emulator.users() {
        println!(
            "  user      {:<22} groups {:>3}  app roles {:?}",
            user.username,
            user.groups.len(),
            user.app_roles
        );
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}
