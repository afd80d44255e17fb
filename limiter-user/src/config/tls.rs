//! The TLS files of `[cluster]` (`tls_ca_file`, `tls_cert_file`,
//! `tls_key_file`), read and checked when the configuration is: a missing,
//! unreadable or malformed file, or a key that is not the certificate's, is
//! refused with its field named, rather than failing every connection to
//! Redis later with the TLS library's words. The bytes checked are kept,
//! so the daemon connects with exactly what was validated.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    ClientConfig, RootCertStore,
};

/// One PEM file as read.
#[derive(Clone, PartialEq, Eq)]
pub struct PemFile {
    pub path: PathBuf,
    pub pem: Vec<u8>,
}

/// Debug names the file, never its bytes (a private key among them).
impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PemFile({})", self.path.display())
    }
}

/// The checked TLS files of `rediss://` URLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificates Redis is verified against; `None`: the
    /// system's trust store.
    pub ca: Option<PemFile>,
    /// This client's certificate and its key (mutual TLS): both or none.
    pub client: Option<(PemFile, PemFile)>,
}

/// A field's name (without `cluster.`) and what is wrong with it.
type FieldError = (&'static str, String);

impl TlsFiles {
    /// Reads and checks the files that are set.
    pub fn load(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, FieldError> {
        let ca = ca
            .map(|path| {
                let file = read("tls_ca_file", path)?;
                let certs = certificates("tls_ca_file", &file)?;
                let mut store = RootCertStore::empty();
                for (i, cert) in certs.into_iter().enumerate() {
                    store.add(cert).map_err(|e| {
                        (
                            "tls_ca_file",
                            format!(
                                "certificate {} of {} is not a usable CA certificate: {e}",
                                i + 1,
                                path.display()
                            ),
                        )
                    })?;
                }
                Ok(file)
            })
            .transpose()?;
        let client = match (cert, key) {
            (None, None) => None,
            (Some(_), None) => {
                return Err((
                    "tls_key_file",
                    "unset, but cluster.tls_cert_file is set: give the certificate's private \
                     key"
                    .into(),
                ))
            }
            (None, Some(_)) => {
                return Err((
                    "tls_cert_file",
                    "unset, but cluster.tls_key_file is set: give the certificate of that key"
                        .into(),
                ))
            }
            (Some(cert_path), Some(key_path)) => {
                let cert = read("tls_cert_file", cert_path)?;
                let chain = certificates("tls_cert_file", &cert)?;
                let key = read("tls_key_file", key_path)?;
                let der = PrivateKeyDer::from_pem_slice(&key.pem).map_err(|e| {
                    (
                        "tls_key_file",
                        format!(
                            "{} holds no usable private key (PEM: PRIVATE KEY, RSA PRIVATE KEY \
                             or EC PRIVATE KEY): {e}",
                            key_path.display()
                        ),
                    )
                })?;
                // What the Redis client will do with them: a key of
                // another certificate, or of an unsupported type, fails
                // here rather than at every connection.
                ClientConfig::builder()
                    .with_root_certificates(RootCertStore::empty())
                    .with_client_auth_cert(chain, der)
                    .map_err(|e| {
                        (
                            "tls_key_file",
                            format!(
                                "{} cannot be used with the certificate of {}: {e}",
                                key_path.display(),
                                cert_path.display()
                            ),
                        )
                    })?;
                Some((cert, key))
            }
        };
        Ok(Self { ca, client })
    }
}

fn read(field: &'static str, path: &Path) -> Result<PemFile, FieldError> {
    let pem =
        std::fs::read(path).map_err(|e| (field, format!("cannot read {}: {e}", path.display())))?;
    Ok(PemFile {
        path: path.to_path_buf(),
        pem,
    })
}

/// The certificates of a PEM file: at least one, every one well formed.
fn certificates(
    field: &'static str,
    file: &PemFile,
) -> Result<Vec<CertificateDer<'static>>, FieldError> {
    let certs = CertificateDer::pem_slice_iter(&file.pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            (
                field,
                format!("{} is not a PEM certificate file: {e}", file.path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err((
            field,
            format!(
                "{} holds no certificate (PEM: BEGIN CERTIFICATE)",
                file.path.display()
            ),
        ));
    }
    Ok(certs)
}
