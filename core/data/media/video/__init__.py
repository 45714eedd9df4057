"""Videos: frames sampled and decoded (`frames`), laid into temporal patches and written as tokens
(`layout`), or cut into image tiles for InternVL (`frame_tiles`)."""
