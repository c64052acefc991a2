//! Every error a command can reply with, each message written once.

use std::ffi::CStr;

/// Why a command was refused. The glue turns it into an error reply; nothing
/// has been written when one of these is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TbError {
    WrongArity,
    Capacity,
    /// Capacity above 2^53, where a whole token no longer changes the count.
    CapacityTooLarge,
    Rate,
    Count,
    CountTooLarge,
    WrongType,
    /// The key at argument `key_arg` holds a hash without usable
    /// `tokens`/`last_refill` fields. The message names the key, so the glue
    /// builds it with `corrupt_bucket_message`.
    CorruptBucket {
        key_arg: usize,
    },
    /// TB.TAKEALL names one key twice: the second charge would silently
    /// overwrite the first.
    DuplicateKey,
    /// The server refused to store a bucket; every key was left as it was
    /// and nothing was propagated.
    WriteFailed,
    /// The `timeout_ms` of TB.BTAKE or TB.ACQUIRE is not a number of ms in
    /// [0, 2^53].
    Timeout,
    /// A TB.BTAKE or TB.ACQUIRE would wait on a key that already has
    /// `tb.max-waiters` waiters of its kind.
    TooManyWaiters,
    /// A TB.BTAKE waiter's bucket became unreadable (another type, or
    /// corrupt) while it waited.
    BucketGone,
    /// TB.ACQUIRE's `limit` is not a whole number in [1, 2^53].
    Limit,
    /// `lease_ms` of TB.ACQUIRE or TB.RENEW is not a whole number in [1, 2^53].
    LeaseMs,
    /// The key at argument `key_arg` holds a sorted set without a usable
    /// `seq` member: not a lease set. The message names the key.
    CorruptLeaseSet {
        key_arg: usize,
    },
    /// The lease set's count of ids has reached 2^53.
    LeaseIdsExhausted,
    /// A TB.ACQUIRE waiter's key became something other than a lease set
    /// (another type, or a sorted set without `seq`) while it waited.
    LeaseSetGone,
    /// An option keyword the command does not take.
    UnknownOption,
    /// TB.TOP's `COUNT` is missing or not a whole number in [1, 2^53].
    TopCount,
    /// TB.TOP's words are neither `[COUNT k]` nor `RESET`.
    TopSyntax,
    /// An option given twice; the message names it.
    RepeatedOption(OptionName),
    /// An option keyword last, without its value; the message names it.
    MissingOptionValue(OptionName),
    /// `MAXWAIT` is not whole ms in [0, 2^53].
    MaxWait,
    /// `BLOCK` is not whole ms in [1, 2^53].
    Block,
    /// `MAXBLOCK` is not whole ms in [1, 2^53], or is less than `BLOCK`.
    MaxBlock,
    /// `MAXBLOCK` without `BLOCK`.
    MaxBlockWithoutBlock,
    /// TB.CHARGE's `MAXDEBT` is not a number in [0, 2^53].
    MaxDebt,
    /// The key at argument `key_arg` holds a bucket whose lock fields
    /// (`locked_until`, `strikes`, `probation_until`) are damaged. The
    /// message names the key.
    CorruptLock {
        key_arg: usize,
    },
    /// TB.THROTTLE's `max_burst` is not a whole number in [0, 2^53 - 1].
    MaxBurst,
    /// TB.THROTTLE's `count` is not a whole number in [1, 2^53].
    ThrottleCount,
    /// TB.THROTTLE's `period` is not a whole number of seconds in [1, 2^53].
    Period,
    /// TB.THROTTLE's `quantity` is not a whole number in [0, 2^53].
    Quantity,
    /// A bug caught by the last-resort `catch_unwind`.
    Internal,
}

/// A keyword option of TB.TAKE and TB.TAKEALL (`MAXWAIT`, `BLOCK`,
/// `MAXBLOCK`) or TB.CHARGE (`MAXDEBT`), as its errors name it: in upper
/// case, whatever case it was given in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionName {
    MaxWait,
    Block,
    MaxBlock,
    MaxDebt,
}

impl TbError {
    /// The reply text for errors whose message does not depend on the
    /// request. `WrongArity` is answered by the server's own message and
    /// `CorruptBucket` names the key, so neither has one here.
    pub fn message(self) -> &'static CStr {
        match self {
            TbError::Capacity => c"ERR capacity must be a positive finite number",
            TbError::CapacityTooLarge => c"ERR capacity must be at most 9007199254740992 (2^53)",
            TbError::Rate => c"ERR rate must be a positive finite number",
            TbError::Count => c"ERR n must be a non-negative finite number",
            TbError::CountTooLarge => c"ERR n must be at most 9007199254740992 (2^53)",
            TbError::WrongType => {
                c"WRONGTYPE Operation against a key holding the wrong kind of value"
            }
            TbError::CorruptBucket { .. } => {
                c"ERR corrupt bucket: tokens and last_refill must be finite numbers"
            }
            TbError::DuplicateKey => c"ERR each key may appear only once in TB.TAKEALL",
            TbError::Timeout => {
                c"ERR timeout_ms must be a non-negative finite number of ms, at most 2^53"
            }
            TbError::TooManyWaiters => {
                c"ERR tb: too many clients wait on this key (see tb.max-waiters)"
            }
            TbError::BucketGone => {
                c"ERR tb: the bucket was overwritten with a value that is not a bucket while waiting"
            }
            TbError::WriteFailed => {
                c"ERR tb: the server refused to store the bucket; nothing was changed"
            }
            TbError::Limit => {
                c"ERR limit must be a positive integer, at most 9007199254740992 (2^53)"
            }
            TbError::LeaseMs => {
                c"ERR lease_ms must be a positive integer number of ms, at most 9007199254740992 (2^53)"
            }
            TbError::CorruptLeaseSet { .. } => {
                c"ERR corrupt lease set: no seq member scored from -2^53 to 0"
            }
            TbError::LeaseIdsExhausted => {
                c"ERR tb: this lease set has handed out 2^53 ids; delete it to start again"
            }
            TbError::LeaseSetGone => {
                c"ERR tb: the lease set was overwritten with a value that is not a lease set while waiting"
            }
            TbError::UnknownOption => {
                c"ERR unknown option (TB.TAKE and TB.TAKEALL take MAXWAIT, BLOCK and MAXBLOCK; TB.CHARGE takes MAXDEBT)"
            }
            TbError::RepeatedOption(OptionName::MaxWait) => c"ERR MAXWAIT is given twice",
            TbError::RepeatedOption(OptionName::Block) => c"ERR BLOCK is given twice",
            TbError::RepeatedOption(OptionName::MaxBlock) => c"ERR MAXBLOCK is given twice",
            TbError::RepeatedOption(OptionName::MaxDebt) => c"ERR MAXDEBT is given twice",
            TbError::MissingOptionValue(OptionName::MaxWait) => c"ERR MAXWAIT needs a value",
            TbError::MissingOptionValue(OptionName::Block) => c"ERR BLOCK needs a value",
            TbError::MissingOptionValue(OptionName::MaxBlock) => c"ERR MAXBLOCK needs a value",
            TbError::MissingOptionValue(OptionName::MaxDebt) => c"ERR MAXDEBT needs a value",
            TbError::MaxWait => {
                c"ERR MAXWAIT must be a whole number of ms from 0 to 9007199254740992 (2^53)"
            }
            TbError::Block => {
                c"ERR BLOCK must be a whole number of ms from 1 to 9007199254740992 (2^53)"
            }
            TbError::MaxBlock => {
                c"ERR MAXBLOCK must be a whole number of ms from BLOCK to 9007199254740992 (2^53)"
            }
            TbError::MaxBlockWithoutBlock => c"ERR MAXBLOCK needs BLOCK",
            TbError::MaxDebt => {
                c"ERR MAXDEBT must be a non-negative finite number, at most 9007199254740992 (2^53)"
            }
            TbError::CorruptLock { .. } => {
                c"ERR corrupt bucket: locked_until, strikes and probation_until must be whole numbers"
            }
            TbError::MaxBurst => {
                c"ERR max_burst must be a whole number from 0 to 9007199254740991 (2^53 - 1)"
            }
            TbError::TopCount => {
                c"ERR COUNT must be a whole number of rows from 1 to 9007199254740992 (2^53)"
            }
            TbError::TopSyntax => c"ERR TB.TOP takes COUNT k or RESET, or nothing",
            TbError::ThrottleCount => {
                c"ERR count must be a whole number from 1 to 9007199254740992 (2^53)"
            }
            TbError::Period => {
                c"ERR period must be a whole number of seconds from 1 to 9007199254740992 (2^53)"
            }
            TbError::Quantity => {
                c"ERR quantity must be a whole number from 0 to 9007199254740992 (2^53)"
            }
            TbError::WrongArity | TbError::Internal => c"ERR tb: internal error (see server log)",
        }
    }
}

/// The corrupt-bucket message for `key`: printable ASCII kept, everything
/// else escaped (so the reply stays one line and NUL-free), cut to 64 bytes.
pub fn corrupt_bucket_message(key: &[u8]) -> std::ffi::CString {
    corrupt_message(
        "ERR corrupt bucket '",
        key,
        "': tokens and last_refill must be finite numbers",
        TbError::CorruptBucket { key_arg: 0 },
    )
}

/// The corrupt-lock message for `key`, escaped as for buckets.
pub fn corrupt_lock_message(key: &[u8]) -> std::ffi::CString {
    corrupt_message(
        "ERR corrupt bucket '",
        key,
        "': locked_until, strikes and probation_until must be whole numbers",
        TbError::CorruptLock { key_arg: 0 },
    )
}

/// The corrupt-lease-set message for `key`, escaped as for buckets.
pub fn corrupt_lease_set_message(key: &[u8]) -> std::ffi::CString {
    corrupt_message(
        "ERR corrupt lease set '",
        key,
        "': no seq member scored from -2^53 to 0",
        TbError::CorruptLeaseSet { key_arg: 0 },
    )
}

fn corrupt_message(before: &str, key: &[u8], after: &str, fallback: TbError) -> std::ffi::CString {
    const SHOWN: usize = 64;
    let shown = key.get(..SHOWN).unwrap_or(key);
    let mut text = String::from(before);
    for byte in shown {
        match byte {
            b'\'' | b'\\' => {
                text.push('\\');
                text.push(char::from(*byte));
            }
            0x20..=0x7e => text.push(char::from(*byte)),
            _ => text.push_str(&format!("\\x{byte:02x}")),
        }
    }
    if key.len() > SHOWN {
        text.push_str("...");
    }
    text.push_str(after);
    // The escaping above leaves no NUL byte; the fallback is unreachable but
    // keeps this function free of panics.
    std::ffi::CString::new(text).unwrap_or_else(|_| fallback.message().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option error names its option, in upper case.
    #[test]
    fn option_errors_name_the_option() {
        for (name, word) in [
            (OptionName::MaxWait, "MAXWAIT"),
            (OptionName::Block, "BLOCK"),
            (OptionName::MaxBlock, "MAXBLOCK"),
            (OptionName::MaxDebt, "MAXDEBT"),
        ] {
            assert_eq!(
                TbError::RepeatedOption(name).message().to_str().unwrap(),
                format!("ERR {word} is given twice")
            );
            assert_eq!(
                TbError::MissingOptionValue(name)
                    .message()
                    .to_str()
                    .unwrap(),
                format!("ERR {word} needs a value")
            );
        }
    }

    #[test]
    fn corrupt_bucket_message_names_the_key() {
        let msg = corrupt_bucket_message(b"rl:user:7");
        assert_eq!(
            msg.to_str().unwrap(),
            "ERR corrupt bucket 'rl:user:7': tokens and last_refill must be finite numbers"
        );
    }

    #[test]
    fn corrupt_bucket_message_escapes_and_cuts_hostile_keys() {
        let mut key = b"a\r\n\0'".to_vec();
        key.extend(std::iter::repeat_n(b'x', 100));
        let msg = corrupt_bucket_message(&key);
        let text = msg.to_str().unwrap();
        assert!(text.starts_with("ERR corrupt bucket 'a\\x0d\\x0a\\x00\\'xxx"));
        assert!(text.contains("...'"));
        assert!(!text.contains('\n'));
    }
}
