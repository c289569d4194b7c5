//! The contract of the cursor-store port ([`CursorStorage`]): one check every implementation
//! runs on two handles of one storage (the cursor files of `deermem-remote`, PostgreSQL's
//! table).

use deermem_core::ports::cursors::{CursorStorage, ReadError};

/// Checks the port's behaviour on two handles `a` and `b` of one storage: missing cursors,
/// round trips, replacement, separate spaces and names, the size bound, and that each
/// handle sees what the other wrote. Panics (it is a test) on the first difference.
pub async fn check(a: &dyn CursorStorage, b: &dyn CursorStorage) {
    let (space, other) = ("contract/cursors", "contract/other");
    assert!(
        a.read(space, "missing.json", 64).await.unwrap().is_none(),
        "a cursor never written is absent"
    );
    a.write(space, "one.json", b"{\"v\":1}".to_vec())
        .await
        .unwrap();
    assert_eq!(
        a.read(space, "one.json", 64).await.unwrap().as_deref(),
        Some(&b"{\"v\":1}"[..])
    );
    assert_eq!(
        b.read(space, "one.json", 64).await.unwrap().as_deref(),
        Some(&b"{\"v\":1}"[..]),
        "another handle on the same storage sees the write"
    );
    b.write(space, "one.json", b"{\"v\":22}".to_vec())
        .await
        .unwrap();
    assert_eq!(
        a.read(space, "one.json", 64).await.unwrap().as_deref(),
        Some(&b"{\"v\":22}"[..]),
        "a write replaces the whole cursor, and the other handle sees it"
    );
    assert!(
        a.read(other, "one.json", 64).await.unwrap().is_none(),
        "spaces are separate"
    );
    assert!(
        a.read(space, "two.json", 64).await.unwrap().is_none(),
        "names are separate"
    );
    a.write(other, "one.json", b"x".to_vec()).await.unwrap();
    assert_eq!(
        a.read(space, "one.json", 64).await.unwrap().as_deref(),
        Some(&b"{\"v\":22}"[..]),
        "a write in one space leaves the other alone"
    );
    // The size bound: exactly the limit is read, one byte more is refused.
    a.write(space, "big.json", vec![b'7'; 9]).await.unwrap();
    assert_eq!(
        a.read(space, "big.json", 9).await.unwrap().map(|v| v.len()),
        Some(9)
    );
    assert!(matches!(
        a.read(space, "big.json", 8).await,
        Err(ReadError::TooLarge(8))
    ));
    // Empty and binary cursors round-trip byte for byte.
    a.write(space, "empty.json", Vec::new()).await.unwrap();
    assert_eq!(
        a.read(space, "empty.json", 8).await.unwrap(),
        Some(Vec::new())
    );
    let binary: Vec<u8> = (0..=255).collect();
    a.write(space, "bin.json", binary.clone()).await.unwrap();
    assert_eq!(b.read(space, "bin.json", 256).await.unwrap(), Some(binary));
    assert!(!a.location(space, "one.json").is_empty());
}
