"""The preview service: writes, serves and expires preview images and bucket exports in
object storage (S3: `storage`), recording each in the coordinator's previews room
(`coordinator`); grants let processors write previews directly (`grants`), and a
cleanup loop deletes what expired (docs/previews-and-uploads.md)."""
