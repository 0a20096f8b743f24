//! Where the client keeps its files: one rule on every Unix, macOS
//! included (the XDG folders, as `gh` does), and the usual folders on
//! Windows.
//!
//! | What | Unix (Linux, macOS, BSD) | Windows |
//! |---|---|---|
//! | configuration | `$XDG_CONFIG_HOME/talos-sso`, else `~/.config/talos-sso` | `%APPDATA%\talos-sso` |
//! | cache (token index) | `$XDG_CACHE_HOME/talos-sso`, else `~/.cache/talos-sso` | `%LOCALAPPDATA%\talos-sso` |

use std::path::PathBuf;

/// The client's configuration folder (`config.yaml`).
pub fn config_dir() -> Option<PathBuf> {
    folder("XDG_CONFIG_HOME", ".config", dirs::config_dir).map(|dir| dir.join("talos-sso"))
}

/// The client's cache folder (`tokens.json`).
pub fn cache_dir() -> Option<PathBuf> {
    folder("XDG_CACHE_HOME", ".cache", dirs::cache_dir).map(|dir| dir.join("talos-sso"))
}

#[cfg(unix)]
fn folder(variable: &str, under_home: &str, _platform: fn() -> Option<PathBuf>) -> Option<PathBuf> {
    xdg_folder(
        std::env::var_os(variable).map(PathBuf::from),
        dirs::home_dir(),
        under_home,
    )
}

#[cfg(not(unix))]
fn folder(_variable: &str, _under_home: &str, platform: fn() -> Option<PathBuf>) -> Option<PathBuf> {
    platform()
}

/// The XDG rule: the variable when it holds an absolute path (the
/// specification says to ignore a relative one), else the folder under home.
fn xdg_folder(variable: Option<PathBuf>, home: Option<PathBuf>, under_home: &str) -> Option<PathBuf> {
    match variable {
        Some(dir) if dir.is_absolute() => Some(dir),
        _ => home.map(|home| home.join(under_home)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absolute_xdg_variable_wins() {
        let got = xdg_folder(Some("/x/cache".into()), Some("/home/a".into()), ".cache");
        assert_eq!(got, Some(PathBuf::from("/x/cache")));
    }

    #[test]
    fn a_relative_or_missing_xdg_variable_means_the_folder_under_home() {
        for variable in [None, Some(PathBuf::from("relative/cache")), Some(PathBuf::new())] {
            let got = xdg_folder(variable, Some("/home/a".into()), ".cache");
            assert_eq!(got, Some(PathBuf::from("/home/a/.cache")));
        }
    }

    #[test]
    fn no_home_and_no_variable_means_no_folder() {
        assert_eq!(xdg_folder(None, None, ".config"), None);
    }
}
