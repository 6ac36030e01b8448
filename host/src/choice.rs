//! Modes that configs and flags spell as words (`adapter: dual-lora`, `--loss-type dapo`): each
//! is an enum, parsed once where the word enters (YAML, a flag, `--set`, a sweep grid) and
//! written back with the same spelling, so saved configs and run names keep their text.
//!
//! Architecture invariant: after parsing, no code compares mode strings; an unknown word is an
//! error naming the key and every accepted word.

/// Declares a word-valued enum: `Serialize`/`Deserialize` as its word, `FromStr` (so clap takes
/// it as a flag value), `Display`, `parse` with an error naming the key.
macro_rules! choice {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($key:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order (sweeps plan an arm per intervention from it).
            #[allow(dead_code, reason = "not every choice's list is read")]
            pub const ALL: &'static [Self] = &[$( Self::$variant ),+];

            /// The word configs and flags use for this value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $word, )+
                }
            }

            pub fn parse(word: &str) -> anyhow::Result<Self> {
                match word {
                    $( $word => Ok(Self::$variant), )+
                    other => anyhow::bail!("unknown {} {other:?}: use {}", $key, $crate::choice::or_list(&[$($word),+])),
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = anyhow::Error;
            fn from_str(word: &str) -> anyhow::Result<Self> {
                Self::parse(word)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl $crate::hyperparams::FlagValue for $name {
            type Flag = Self;
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let word = <String as serde::Deserialize>::deserialize(deserializer)?;
                Self::parse(&word).map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use choice;

/// `a, b or c`.
pub fn or_list(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    choice! {
        /// A test-only mode.
        pub enum Flavour ("flavour") {
            Sweet = "sweet",
            SourCherry = "sour-cherry",
        }
    }

    #[test]
    fn words_round_trip_and_unknown_words_name_the_key_and_the_choices() {
        assert_eq!(Flavour::parse("sour-cherry").unwrap(), Flavour::SourCherry);
        assert_eq!(serde_json::to_value(Flavour::SourCherry).unwrap(), serde_json::json!("sour-cherry"));
        assert_eq!(serde_json::from_value::<Flavour>(serde_json::json!("sweet")).unwrap(), Flavour::Sweet);
        let error = serde_json::from_value::<Flavour>(serde_json::json!("salty")).unwrap_err().to_string();
        assert_eq!(error, "unknown flavour \"salty\": use sweet or sour-cherry");
    }
}
