//! The decoding modes, named once: the CLI, the JS API and the statistics spell them as
//! [`Mode::name`] gives, and list them from [`Mode::ALL`].

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

// What runs a mode is the `Strategy` of that mode the engine prepared (`super::Strategy`).
/// A decoding strategy, as a generation asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "lowercase"))]
pub enum Mode {
    /// Autoregressive: one target forward per token.
    Ar,
    /// Speculative decoding.
    Sd,
    /// Speculative speculative decoding.
    Ssd,
}

impl Mode {
    /// Every mode, in the order front-ends list them.
    pub const ALL: [Mode; 3] = [Mode::Ar, Mode::Sd, Mode::Ssd];

    /// The mode's name in options, statistics and the JS API.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Ar => "ar",
            Mode::Sd => "sd",
            Mode::Ssd => "ssd",
        }
    }

    /// The names of all modes, for messages: "ar, sd or ssd".
    pub fn names(last: &str) -> String {
        let names: Vec<&str> = Mode::ALL.iter().map(|m| m.name()).collect();
        match names.split_last() {
            Some((tail, [])) => (*tail).to_string(),
            Some((tail, init)) => format!("{} {last} {tail}", init.join(", ")),
            None => String::new(),
        }
    }
}

impl FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::option("mode", format!("'{s}': expected {}", Mode::names("or"))))
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        assert_eq!("ssd".parse::<Mode>().unwrap(), Mode::Ssd);
        assert_eq!("ar".parse::<Mode>().unwrap().to_string(), "ar");
        assert!("spec".parse::<Mode>().is_err());
        assert!(Mode::ALL.iter().all(|m| m.name().parse::<Mode>().ok() == Some(*m)));
        assert_eq!(Mode::names("or"), "ar, sd or ssd");
    }
}
